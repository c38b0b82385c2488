"""What a user's model really needs, measured (imports torch, lazily, and only here and in the ranks).

- ``facts``       ``model_facts`` (the trace, for the numerics the plan can use) and ``model_facts_probed``
                  (then real steps on GPU 0): the ``ModelFacts`` the planner plans from;
- ``build``       the model built without its memory (fake tensors, the meta device);
- ``trace``       the fake-tensor trace on the CPU's kernels; ``cuda_trace`` the same step as CUDA's kernels keep
                  it (``step_trace`` step after step); ``fsdp_trace`` FSDP2's own line under a fake process group;
- ``repeated``    the model's repeated block (or why none); ``block_trace`` GPU plans' steps traced with 3, 4 and 5 of
                  its blocks, ``depth_scale`` extended to all of them (else traced whole);
- ``gpu_probe``   real steps on the GPU itself, in a child process;
- ``timing``      the model's step timed for real on this CPU, as the plan's ranks will run it (child processes);
- ``timing_rule`` whether a plan's step is timed here, and the condition that failed when it is not;
- ``child``       a measuring child process's one answer (its line of JSON, or its error), both sides;
- ``cache``       what is kept between runs, keyed by everything a measurement depends on; ``cache_checks``
                  what an entry read back may hold (values a measurement gives).

The planner never measures; ``prepare`` calls this package and hands the planner what it found.
"""

from autotune.measure.facts import model_facts, model_facts_probed

__all__ = ["model_facts", "model_facts_probed"]
