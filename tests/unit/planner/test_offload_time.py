"""Offload's time: the host's per-step costs (its walk over the tensors, its synchronisation with the GPU, each
copy's submission over PCIe, ZeRO-3's and FSDP2's fetch of each module from the host for the forward and again for
the backward), so that a model whose states fit on the GPU is never predicted faster with offload than without."""

from pathlib import Path

import pytest

from autotune.config import load_config
from autotune.errors import PlanRefused, UserError
from autotune.planner.communication import PCIE_CALL_S, transfer_s
from autotune.planner.step_time import ENGINES, OFFLOAD_SYNC_S, Link
from autotune.prepare import weigh_for
from autotune.profiles import preset_names

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted([ROOT / "configs" / "default_config.yaml", *(ROOT / "examples").glob("*.yaml"),
                  *(ROOT / "tests" / "golden").glob("*.yaml")])
# each offload line and the same engine keeping its state on the GPU
RESIDENT = {"zero2_offload": "zero2", "zero3_offload": "zero3", "fsdp_offload": "fsdp"}


def pairs(rows):
    """(resident, offload) rows of the same engine and checkpointing that both fit and are both timed."""
    fits = {(rw.strategy.name, rw.checkpointing): rw for rw in rows if rw.why_not is None and rw.time is not None}
    return [(fits[(RESIDENT[name], ckpt)], rw) for (name, ckpt), rw in fits.items()
            if name in RESIDENT and (RESIDENT[name], ckpt) in fits]


def weighed_rows(config: Path, preset: str, micro: int | None = None):
    """The rows ``estimate`` weighs for ``config`` on ``preset`` (at the micro-batch ``micro`` where given), or ()
    where the config cannot run there (FSDP2 asked for on T4s)."""
    cfg = load_config(str(config))
    if micro is not None:
        cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"batch_size_per_gpu": micro})})
    try:
        _, weighing, _ = weigh_for(cfg, None, preset)
    except PlanRefused as e:
        weighing = e.weighing
    except UserError:
        return ()
    return weighing.rows if weighing else ()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_offload_is_never_predicted_faster_than_the_same_engine_keeping_its_state_on_the_gpu(config):
    """Every preset and shipped config: where X and X + offload both fit, X's predicted samples/s is at least
    X + offload's at the same micro-batch (a tiny model's offloaded step once skipped the GPU optimizer's kernels
    and paid nothing on the host: 62,967 samples/s with ZeRO-3 + offload against DDP's 42,409 on 4xL4). Where
    offload's freed memory buys a larger micro-batch than X's largest, the rows are compared again at X's: fewer
    micro-steps is what the larger micro-batch buys, never the offload itself."""
    weighed = 0
    for preset in preset_names():
        for resident, offload in pairs(weighed_rows(config, preset)):
            if offload.micro != resident.micro:
                again = dict(((a.strategy.name, a.checkpointing), (a, b))
                             for a, b in pairs(weighed_rows(config, preset, resident.micro)))
                resident, offload = again[(resident.strategy.name, resident.checkpointing)]
            weighed += 1
            assert resident.micro == offload.micro
            assert resident.time.samples_per_s >= offload.time.samples_per_s, (preset, offload.label, offload.micro,
                                                                                resident.time, offload.time)
    if config.name in ("default_config.yaml", "byo_config.yaml", "big_model.yaml"):
        # the configs with a known model weigh offload beside the engine without it (torchrun_config's plain DDP
        # script is weighed on DDP alone: exports.script_engines)
        assert weighed


def test_offload_pays_the_host_walk_its_synchronisation_and_each_copys_submission():
    """The offloaded optimizer step is the host's walk over the tensors (the GPU step's dispatch, paid on the host),
    CPU Adam at its rate and one synchronisation; a PCIe copy costs its submission per call besides its bytes."""
    from autotune.planner.step_time import host_step_s
    from autotune.planner.step_work import PhaseWork, StepWork

    class Cal:
        kernel_s = 4e-5

    opt = PhaseWork(rows=(("memory", -1, 0.0, 28.0 * 1e6, 13),))
    step = StepWork(micro=1, forward=PhaseWork(), backward=PhaseWork(), optimizer=opt)
    parts = host_step_s(step, ENGINES["zero2_offload"], 1_000_000, 1 / 4, 2.0, Cal())
    assert parts == {"offload's walk over the tensors": pytest.approx(13 * 4e-5),
                     "CPU Adam": pytest.approx(250_000 / 2e8), "offload sync": OFFLOAD_SYNC_S}
    link = Link(None, 25e9, "one process")
    line = ENGINES["zero3_offload"]
    to_host = next(c for c in line.collectives if c.op == "to_host")
    name, secs, tail = transfer_s(to_host, line, "zero3_offload", 1, link, 1_000_000, 24)
    assert name == "PCIe" and secs == pytest.approx(4e6 / 25e9 + 24 * PCIE_CALL_S) and tail == pytest.approx(secs / 24)
    # ZeRO-3's and FSDP2's offloaded partitions are fetched from the host for the forward and for the backward
    for name in ("zero3_offload", "fsdp_offload"):
        assert sum(c.op == "from_host" and c.when == "micro" for c in ENGINES[name].collectives) == 2


def test_an_offloaded_steps_description_names_the_host_optimizers_rate_and_its_source():
    """The host's arithmetic is timed at a documented rate, not one timed here: the plan's ranking says which."""
    from autotune.planner.step_time import HOST_ADAM_PART, StepTime

    for who, words in (("deepspeed", "DeepSpeed's CPU Adam at about 1e8"), ("torch", "torch's AdamW on the host")):
        t = StepTime(0.1, 0.2, 0.0, 0.3, 100.0, parts=((HOST_ADAM_PART[who], 0.15), ("offload sync", 0.002)))
        said = t.describe()
        assert said.startswith(f"{HOST_ADAM_PART[who]} 0.15 s a step, offload sync 0.002 s a step; ")
        assert words in said and "Ren et al. 2021" in said
    resident = StepTime(0.1, 0.2, 0.05, 0.35, 100.0, parts=(("all-reduce", 0.05),))
    assert resident.describe() == "all-reduce 0.05 s a step"
