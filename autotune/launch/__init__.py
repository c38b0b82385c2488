"""The launch: ``run(setup)`` takes a prepared ``RunSetup`` (autotune.prepare) to an exit code.

- ``sequence``        ``checked_setup``: the plan, its run directory checked; ``run``: preflight, the nodes'
                      exchange, the lock, the records, the run log, execute, the end;
- ``ending``          how a run ended, as a pure rule: the exit code and the lines that say it;
- ``preflight``       this node's checks before any rank starts, and the hint after a failure;
- ``exchange``        the nodes' hardware exchange (each node's side, the job's secret); ``exchange_host`` node 0's;
- ``process``         ``execute``: the one place that spawns (signals forwarded, the process tree ended);
- ``rank_watch``      how each rank ended, from the statuses the ranks leave;
- ``runlog``          the launch's output, copied into the run directory;
- ``builds``          what it says while a rank builds DeepSpeed's ops;
- ``evidence``        the watch on a user's script while it runs: its first steps judged, --strict, the end;
- ``judgement``       what a user's script observably ran, against the plan, and its wording;
- ``observed``        the observer's records read back: what one rank trained;
- ``verdicts``        each plan value against what was observed, with the fix;
- ``rate_rule``       the learning rate judged as a schedule;
- ``script_ends``     when a user's script's ranks ended, decided by their processes (not by a file);
- ``speed_check``     the run's measured speed against the plan's prediction (timing.json);
- ``announce``        what it says before it starts: the resume's changes, the plan's delivery to a script.
"""

from autotune.launch.sequence import checked_setup, run

__all__ = ["checked_setup", "run"]
