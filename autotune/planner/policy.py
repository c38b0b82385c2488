"""The planning policy: data from configs/policy.yaml, validated; no planning logic here.

``load_policy(path)`` reads and validates the file (cached); the planner
(``autotune.planner``) looks values up through ``Policy.band_for`` and
``Policy.precision_for``. Every number in the file carries its source there.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import UserError, format_validation_error
from autotune.plan import Precision

DEFAULT_POLICY_PATH = Path(__file__).resolve().parents[2] / "configs" / "policy.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Band(_Strict):
    min_memory_gb: float = Field(ge=0)
    micro_batch_size: int = Field(ge=1)
    gradient_checkpointing: bool


class PrecisionRule(_Strict):
    min_compute_capability: float = Field(ge=0)
    precision: Precision
    tf32: bool


STRATEGY_NAMES = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp", "fsdp_no_reshard",
                  "fsdp_offload", "hsdp", "hsdp_no_reshard")


class StrategyOption(_Strict):
    strategy: str
    checkpointing: bool

    def model_post_init(self, _ctx) -> None:
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGY_NAMES)}, got {self.strategy!r}")


class Policy(_Strict):
    micro_batch_bands: tuple[Band, ...] = Field(min_length=1)
    cpu_micro_batch_size: int = Field(ge=1)
    precision_by_compute_capability: tuple[PrecisionRule, ...] = Field(min_length=1)
    memory_headroom_fraction: float = Field(gt=0, le=1)
    offload_host_ram_margin: float = Field(ge=1)
    prefetch_ram_per_worker_gib: float = Field(gt=0)
    strategy_preference: tuple[StrategyOption, ...] = Field(min_length=1)
    cuda_context_mib: float = Field(ge=0)
    nccl_buffers_mib: float = Field(ge=0)
    # the caching allocator above the allocated peak (planner.headroom): its reserved slack, as a fraction of the
    # estimate, and one block of the step's largest allocation
    allocator_slack_fraction: float = Field(0.011, ge=0, le=1)
    allocator_largest_block: bool = True
    # the estimate's own out-of-sample error, as a fraction of its traced activations (planner.headroom)
    estimate_margin_fraction: float = Field(0.03, ge=0, le=1)
    traced_activation_margin: float = Field(ge=1)
    # a model traced as CUDA runs it: "fit" plans the largest micro-batch that fits (up to global / world);
    # "band" keeps the VRAM band table's, as for the built-in workload and models that are not traced
    micro_batch_rule: Literal["fit", "band"] = "fit"
    # fp32 on GPUs: cuDNN's fp32 convolution workspaces, which no trace on a CPU sees (measured on an H100
    # against the CPU trace, BENCHMARKS.md); half precision needs none since the trace runs as CUDA does.
    traced_activation_margin_gpu_fp32: float = Field(4.5, ge=1)
    host_ram_headroom_fraction: float = Field(gt=0, le=1)
    mig_multi_process: bool = False
    # how the engine is chosen where the model's work is counted (a traced model on a GPU of the table): "time",
    # the most predicted samples/s at the held global batch; "seed", the preference order's rule (2+ GPUs and
    # DeepSpeed installed -> ZeRO-2), which stays the rule where there is nothing to time
    engine_rule: Literal["time", "seed"] = "time"

    def band_for(self, memory_gb: float) -> Band:
        for band in sorted(self.micro_batch_bands, key=lambda b: -b.min_memory_gb):
            if memory_gb >= band.min_memory_gb:
                return band
        return min(self.micro_batch_bands, key=lambda b: b.min_memory_gb)

    def precision_for(self, cc: float) -> PrecisionRule:
        for rule in sorted(self.precision_by_compute_capability, key=lambda r: -r.min_compute_capability):
            if cc >= rule.min_compute_capability:
                return rule
        return min(self.precision_by_compute_capability, key=lambda r: r.min_compute_capability)


@lru_cache(maxsize=8)
def load_policy(path: str | None = None) -> Policy:
    from autotune.safe_input import load_yaml, read_text

    p = Path(path) if path else DEFAULT_POLICY_PATH
    data = load_yaml(read_text(p, "--policy"), f"--policy {p}")
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(e, f"{p}: not a valid policy",
                                                keys_in="configs/policy.yaml")) from None
