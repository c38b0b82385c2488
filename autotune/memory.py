"""Memory estimates for planning (pure arithmetic, no torch).

Model states follow the ZeRO paper (Rajbhandari et al., 2020, section 3): with
mixed-precision Adam each parameter costs 2 bytes of half weights, 2 of half
gradients and 12 of optimizer state (fp32 master weights, momentum, variance);
plain PyTorch AMP keeps fp32 weights and gradients, 16 bytes in all. ZeRO
partitions optimizer state (stage 1), gradients (2) and weights (3) over the
data-parallel ranks.

Activations follow Korthikanti et al., 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), eq. 1: per layer
``s*b*h*(34 + 5*a*s/h)`` bytes in half precision; with full recomputation only
each layer's input (``2*s*b*h`` bytes) is kept. fp32 doubles both.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


def gpt_num_parameters(n_layer: int, n_embd: int, vocab_size: int, block_size: int) -> int:
    """Parameters of the built-in GPT: blocks (12*d^2 + 13*d each), embeddings, final norm.

    The output head is tied to the token embedding.
    """
    per_block = 12 * n_embd * n_embd + 13 * n_embd
    return n_layer * per_block + vocab_size * n_embd + block_size * n_embd + 2 * n_embd


@dataclass(frozen=True)
class ModelStates:
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float

    @property
    def gpu_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


def model_state_bytes(num_params: int, world_size: int, zero_stage: int | None, offload_optimizer: bool) -> ModelStates:
    """Per-GPU bytes of weights, gradients and optimizer state."""
    n = max(1, world_size)
    p = float(num_params)
    if zero_stage is None:  # single / DDP with AMP: fp32 weights + grads, Adam m and v
        return ModelStates(4 * p, 4 * p, 8 * p)
    weights = 2 * p / (n if zero_stage >= 3 else 1)
    grads = 2 * p / (n if zero_stage >= 2 else 1)
    optim = 12 * p / (n if zero_stage >= 1 else 1)
    if offload_optimizer:
        optim = 0.0
    return ModelStates(weights, grads, optim)


def optimizer_host_bytes_per_rank(num_params: int, world_size: int) -> float:
    """Host RAM one rank needs when ZeRO-2 offloads its optimizer partition."""
    return 12.0 * num_params / max(1, world_size)


def activation_bytes(micro_batch: int, seq_len: int, n_embd: int, n_head: int, n_layer: int,
                     vocab_size: int, checkpointing: bool, half_precision: bool) -> float:
    s, b, h, a = seq_len, micro_batch, n_embd, n_head
    if checkpointing:
        per_layer = 2.0 * s * b * h
    else:
        per_layer = s * b * h * (34.0 + 5.0 * a * s / h)
    scale = 1.0 if half_precision else 2.0
    logits = 4.0 * 2 * s * b * vocab_size  # fp32 logits and their gradient
    return scale * per_layer * n_layer + logits
