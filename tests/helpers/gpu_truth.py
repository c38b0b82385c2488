"""What an H100 recorded (bench/gpu_truth), as the planner's inputs."""

import json

from autotune.config import TrainConfig, apply_overrides
from autotune.planner.model_facts import CUDA_TRACED, ActivationModel, LinearBytes, ModelFacts, builtin_work
from helpers.support import ROOT

TRUTH = ROOT / "bench" / "gpu_truth"


def recorded_facts(model: str) -> tuple[TrainConfig, ModelFacts]:
    """GPT-2-small-sized facts: its recorded peaks on the H100 (minus the 16 bytes a parameter the step held) as
    the activation lines, and the built-in GPT's work formula at GPT-2 small's shape."""
    rec = json.loads((TRUTH / "h100" / f"{model}.json").read_text())
    params = rec["params"]

    def line(ckpt):  # None where the model was not recorded with checkpointing (ResNet-50)
        pts = tuple((p["micro"], float(p["peak"] - 16 * params)) for p in rec["points"]
                    if p["ok"] and p["ckpt"] == ckpt)
        return LinearBytes(points=pts, interpolate=True) if pts else None

    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.global_batch_size": 256,
                                          "training.max_steps": 10})
    base = TrainConfig()  # GPT-2 small's shape, beyond the built-in workload's limits: not validated
    shape = base.model_copy(update={"model": base.model.model_copy(update={"n_layer": 12, "n_embd": 768, "n_head": 12}),
                                    "data": base.data.model_copy(update={"vocab_size": 50257, "seq_len": 512})})
    acts = ActivationModel(half=line(False), half_checkpointed=line(True), half_weights=line(False),
                           half_weights_checkpointed=line(True), source=CUDA_TRACED)
    facts = ModelFacts(source=f"recorded {model}", num_parameters=params, trainable_parameters=params,
                       largest_layer_parameters=50257 * 768, activations=acts, work=builtin_work(shape, params))
    return cfg, facts
