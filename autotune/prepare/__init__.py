"""Run setup as a library: config + overrides + hardware (+ the measured model) -> ``RunSetup``.

- ``planning``    ``plan_for``: (plan, profile, DeepSpeed dict), what ``plan``, ``export`` and ``report`` need;
                  ``weigh_for``: with what was weighed (``estimate``); the hardware resolved, the model measured
                  (``autotune.measure``), past runs and this CPU's timing;
- ``resume``      the run directory and the checkpoint a launch resumes from, resolved once and verified;
- ``entrypoint``  ``check_entrypoint``: the script or module:function, checked on the machine it runs on;
- ``run_setup``   ``prepare``: the plan, the run directory, the resume point, the script's wiring and the
                  ``LaunchSpec``, as one ``RunSetup``.

It writes nothing and spawns nothing: ``autotune.rundir.records`` writes the records, ``autotune.launch`` runs them.
"""

from autotune.prepare.entrypoint import check_entrypoint
from autotune.prepare.planning import could_time_here, plan_for, resolve_hardware, speed_key, weigh_for
from autotune.prepare.resume import resolve_resume
from autotune.prepare.run_setup import RunSetup, prepare

__all__ = ["RunSetup", "check_entrypoint", "could_time_here", "plan_for", "prepare", "resolve_hardware",
           "resolve_resume", "speed_key", "weigh_for"]
