"""The planner: ``plan(hw, cfg) -> TrainingPlan``, a pure function.

No torch, no environment reads, no subprocesses: the same inputs always give the same plan, in milliseconds.

- ``compose``        ``plan``: the decisions in order, and the plan made of them; ``weigh``: with what it weighed;
- ``deciders``       each knob in its own short function (where it runs, memory band, accumulation); the engine's
                     seed (``engine_seed``), ``precision``, the global batch (``global_batch``), the ``loader``,
                     the run's steps (``schedule``);
- ``resolve``        the user's values over auto's, each with its reason ("auto would choose X, you set Y") naming
                     its source (the config, or a variable you exported);
- ``memory_fit``     the memory ladder: strategy, micro-batch and checkpointing that fit; ``weighing`` its data,
                     ``sizing`` each option's need, ``refusal`` what would fit when nothing does;
- ``choice``         the options and the pick by predicted time, the one engine decision;
- ``fsdp_reasons``   FSDP2's and HSDP's settings in words (the mesh, and what each sends between nodes);
- ``memory``         memory arithmetic per strategy (DeepSpeed's accounting, FSDP2's shards and gathers); the
                     strategy table, read backwards by ``strategy_of`` (a run's speed is kept under its name);
- ``micro``          the micro-batch of a model traced as CUDA runs it;
- ``step_time``      the time of a step (``communication`` what each engine sends, over which link);
                     ``time_estimate`` each option's time and the plan's figures;
- ``model_facts``    what the planner knows of the model (measured elsewhere: ``autotune.measure``); ``step_work``
                     the work of a traced step;
- ``policy``, ``gpus`` the tables it plans by (configs/policy.yaml, configs/gpus.yaml);
- ``nodes``, ``pods`` the smallest-node rule, a training operator's node facts.
"""

from autotune.planner.compose import plan, weigh

__all__ = ["plan", "weigh"]
