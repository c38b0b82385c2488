"""--grad_accum alone (issue 33): the user's accumulation, the planner's micro-batch, the global batch held where
memory allows, and a plain warning where it does not."""

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.profiles import load_profile


def _plan(preset, **fields):
    return plan(load_profile(preset), apply_overrides(TrainConfig(), {f"training.{k}": v for k, v in fields.items()}),
                deepspeed_installed=True)


def test_your_accumulation_raises_the_micro_batch_to_hold_the_global_batch():
    """4 L4s, --grad_accum 1: the band's micro-batch 16 would train 16 x 1 x 4 = 64 of the target 256; 64 fits
    (the built-in GPT is tiny), so the plan holds 256 at 64 x 1 x 4 and the rate needs no rescaling."""
    p = _plan("4xL4", gradient_accumulation_steps=1)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.batch.global_batch_size) == (64, 1, 256)
    assert p.reasons["micro_batch_size"] == ("micro-batch 64 holds the target global batch 256 with your "
                                             "gradient_accumulation_steps 1 (64 x 1 x 4 process(es))")
    assert p.overrides["gradient_accumulation_steps"].auto == 4  # auto: the band's 16, accumulation 4
    assert p.warnings == ()
    lower = _plan("4xL4", gradient_accumulation_steps=8)  # and lowers it: 8 x 8 x 4
    assert (lower.batch.micro_batch_size, lower.batch.global_batch_size) == (8, 256)
    odd = _plan("4xL4", gradient_accumulation_steps=3)  # no whole micro-batch holds 256: the closest, 21 x 3 x 4
    assert (odd.batch.micro_batch_size, odd.batch.global_batch_size, odd.warnings) == (21, 252, ())
    assert odd.reasons["micro_batch_size"].startswith("micro-batch 21 comes closest to the target global batch 256")


def test_where_memory_does_not_allow_the_warning_says_so_and_why():
    """A 300M-parameter GPT on one T4 with a target of 1024 and --grad_accum 1: micro-batch 1024 does not fit,
    halved to 256 with checkpointing it does; the global batch is 256, and the plan says so plainly."""
    p = plan(load_profile("1xT4"), apply_overrides(TrainConfig(), {
        "model.n_layer": 24, "model.n_embd": 1024, "model.n_head": 16, "data.seq_len": 256, "data.vocab_size": 1000,
        "training.global_batch_size": 1024, "training.gradient_accumulation_steps": 1}), deepspeed_installed=True)
    assert (p.batch.micro_batch_size, p.batch.global_batch_size) == (256, 256)
    assert p.warnings == ("global batch 256 is 75% below the target 1024 with your gradient_accumulation_steps 1: "
                          "micro-batch 1024 would hold it, but 256 is the largest that fits in memory; leave "
                          "gradient_accumulation_steps to autotune (auto) to hold it",)
    assert p.reasons["micro_batch_size"].endswith("; 256 is the largest that fits with DDP + checkpointing (11.5 GiB "
                                                  "estimated)")


def test_an_undescribed_model_is_not_raised_blind_and_the_warning_says_why():
    """A user's script whose model is not described: the estimate cannot check micro-batch 64, so the band's 16
    stays; with accumulation 128, even micro-batch 1 overshoots the target."""
    p = _plan("4xL4", entrypoint="train.py", gradient_accumulation_steps=1)
    assert (p.batch.micro_batch_size, p.batch.global_batch_size) == (16, 64)
    assert p.reasons["micro_batch_size"].endswith("; micro-batch 64 holds the target global batch 256 with your "
                                                  "gradient_accumulation_steps 1 (64 x 1 x 4 process(es)), but the "
                                                  "memory estimate cannot check it: the band's is kept")
    assert p.warnings == ("global batch 64 is 75% below the target 256 with your gradient_accumulation_steps 1: "
                          "micro-batch 64 would hold it, but the memory estimate cannot check it (describe the "
                          "model: training.model or training.num_parameters), so 16 is kept; leave "
                          "gradient_accumulation_steps to autotune (auto) to hold it",)
    over = _plan("4xL4", gradient_accumulation_steps=128)
    assert over.warnings == ("global batch 512 is 100% above the target 256 with your gradient_accumulation_steps "
                             "128: no micro-batch holds it: 1 x 128 x 4 process(es) is the closest; leave "
                             "gradient_accumulation_steps to autotune (auto) to hold it",)


def test_a_micro_batch_you_set_or_debug_is_left_alone():
    both = _plan("4xL4", gradient_accumulation_steps=1, batch_size_per_gpu=16, global_batch_size=64)
    assert (both.batch.micro_batch_size, both.batch.global_batch_size) == (16, 64)
    debug = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"training.gradient_accumulation_steps": 2}),
                 deepspeed_installed=True, debug=True)
    assert debug.batch.micro_batch_size == 4 and "holds" not in debug.reasons["micro_batch_size"]
