"""The built-in default workload: a small GPT learning to sort digits.

A real model on a real, learnable task that needs no download: every sample is
``seq_len`` random digits followed by the same digits sorted, generated from a
seed. The model reads the whole sequence causally and is scored only on the
sorted half, so chance accuracy is ``1 / vocab_size`` and a model that has
learned to sort approaches 100%. Model size scales from a CPU demo (~0.1 M
parameters) to hundreds of millions (``n_layer: 24, n_embd: 1024``).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE = -100


class SortDataset(torch.utils.data.Dataset):
    """``num_samples`` sequences generated from ``seed``; identical on every rank."""

    def __init__(self, num_samples: int, seq_len: int, vocab_size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        digits = torch.randint(0, vocab_size, (num_samples, seq_len), generator=g)
        full = torch.cat([digits, digits.sort(dim=1).values], dim=1)
        self.x = full[:, :-1].contiguous()
        y = full[:, 1:].clone()
        y[:, : seq_len - 1] = IGNORE  # only the sorted half is scored
        self.y = y.contiguous()

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_datasets(data) -> tuple[SortDataset, SortDataset]:
    """Train and validation sets from the plan's ``workload.data``."""
    n = data.num_samples or 16384
    train = SortDataset(n, data.seq_len, data.vocab_size, data.seed)
    val = SortDataset(max(1, data.num_val_samples), data.seq_len, data.vocab_size, data.seed + 1_000_003)
    return train, val


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc_out = nn.Linear(4 * n_embd, n_embd)
        self.n_head = n_head
        self.dropout = dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, gradient_checkpointing: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.gradient_checkpointing = gradient_checkpointing
        if not self.tok.weight.is_meta:  # on the meta device (FSDP2): init_weights fills the shards once made
            self.init_weights()

    def gradient_checkpointing_enable(self) -> None:
        """The switch Hugging Face models offer (``autotune.measure.timing`` turns it on by that name)."""
        self.gradient_checkpointing = True

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2's initialisation (normal 0.02, residual projections scaled by 1 / sqrt(2 n_layer), zero biases, unit
        norms), each parameter drawn whole on the CPU from one generator seeded by ``seed`` (torch's initial seed by
        default) and copied into the part this process holds: the same weights whether the parameters are whole or
        FSDP2's shards of a model built on the meta device, with one parameter whole at a time."""
        g = torch.Generator().manual_seed(torch.initial_seed() if seed is None else seed)
        scaled = 0.02 / math.sqrt(2 * len(self.blocks))
        for module_name, m in self.named_modules():
            for name, p in m.named_parameters(recurse=False):
                full = torch.empty(tuple(p.shape), dtype=torch.float32)
                if isinstance(m, nn.LayerNorm):
                    full.fill_(1.0 if name == "weight" else 0.0)
                elif name == "bias":
                    full.zero_()
                else:
                    full.normal_(0.0, scaled if module_name.endswith(("proj", "fc_out")) else 0.02, generator=g)
                _copy_part(p, full)

    def logits(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return F.linear(self.ln_f(x), self.tok.weight)  # head tied to the embedding

    def forward(self, idx, targets=None):
        """The loss, or the logits when no targets are given. Evaluation goes through here
        too: DeepSpeed ZeRO-3 gathers partitioned weights only inside forward calls."""
        logits = self.logits(idx)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1), ignore_index=IGNORE)


def _copy_part(p: torch.Tensor, full: torch.Tensor) -> None:
    """``full`` into parameter ``p``: whole, or, for a DTensor (FSDP2's sharded parameter), the chunk of each mesh
    dimension it is sharded over that this rank holds (``torch.chunk``'s split, as FSDP2 shards)."""
    placements = getattr(p, "placements", None)
    if placements is None:
        p.copy_(full)
        return
    mesh, part = p.device_mesh, full
    for mesh_dim, placement in enumerate(placements):
        if placement.is_shard():
            chunks = torch.chunk(part, mesh.size(mesh_dim), dim=placement.dim)
            rank = mesh.get_local_rank(mesh_dim)
            part = chunks[rank] if rank < len(chunks) else part.narrow(placement.dim, 0, 0)
    p.to_local().copy_(part)


def build_model(workload, gradient_checkpointing: bool = False, on_meta: bool = False) -> GPT:
    """The GPT of the plan's ``workload`` section; ``on_meta``: on the meta device, no storage (FSDP2 shards it and
    ``init_weights`` fills the shards: the whole model never exists in a rank)."""
    m, d = workload.model, workload.data
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        return GPT(d.vocab_size, 2 * d.seq_len - 1, m.n_layer, m.n_head, m.n_embd, m.dropout, gradient_checkpointing)


def timed_model(workload: dict) -> GPT:
    """The built-in GPT of a plan's ``workload`` section (as JSON), as ``autotune.measure.timing`` builds it by
    name (``autotune.runtime.workload:timed_model``) to time its step: its forward with targets is the loss."""
    from autotune.plan import WorkloadSection

    return build_model(WorkloadSection.model_validate(workload))


def timed_batch(b: int, workload: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``b`` samples of the built-in task (inputs, targets), for the same timing."""
    d = workload["data"]
    ds = SortDataset(b, d["seq_len"], d["vocab_size"], 0)
    return ds.x, ds.y


@torch.no_grad()
def eval_sums(model: GPT, batches, device, autocast) -> torch.Tensor:
    """[sum of token losses, correct tokens, scored tokens, exact-match sequences, sequences]."""
    out = torch.zeros(5, dtype=torch.float64, device=device)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast():
            logits = model(x).float()
        mask = y != IGNORE
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), ignore_index=IGNORE, reduction="sum")
        correct = (logits.argmax(-1) == y) & mask
        out += torch.tensor([loss.item(), correct.sum().item(), mask.sum().item(),
                             (correct.sum(1) == mask.sum(1)).sum().item(), x.shape[0]],
                            dtype=torch.float64, device=device)
    return out
