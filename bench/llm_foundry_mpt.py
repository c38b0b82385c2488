"""MPT-760M and MPT-30B as llm-foundry's pretraining yamls build them (scripts/train/yamls/pretrain/mpt-760m.yaml,
mpt-30b.yaml: d_model, n_heads, n_layers, vocabulary 50,368, expansion ratio 4, no biases, no dropout, the output head
tied to the token embedding, sequence 2048), as plain modules for bench/bench_llm_foundry.py, holding what MPT's step
holds: MPT's ``low_precision_layernorm`` (its default norm: LayerNorm without bias computed in the autocast dtype, so
no fp32 copies of the residual stream are kept), a fused Wqkv, causal attention through torch's SDPA (the rows ran
llm-foundry's triton FlashAttention with ALiBi; SDPA's flash kernel keeps the same tensors, and ALiBi adds no
parameters), and the loss on the bf16 logits (the rows ran flash-attn's fused cross-entropy, which never makes fp32
logits: here the log-softmax in bf16, the same bytes)."""
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

SEQ, VOCAB = 2048, 50368


class LPLayerNorm(nn.LayerNorm):
    """MPT's low_precision_layernorm: the norm in the autocast dtype (llm-foundry's norm.py)."""

    def forward(self, x):
        if not torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        dt = torch.get_autocast_dtype(x.device.type)
        w = None if self.weight is None else self.weight.to(dt)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.to(dt), self.normalized_shape, w, None, self.eps)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm_1 = LPLayerNorm(d, bias=False)
        self.Wqkv = nn.Linear(d, 3 * d, bias=False)
        self.out_proj = nn.Linear(d, d, bias=False)
        self.norm_2 = LPLayerNorm(d, bias=False)
        self.up_proj = nn.Linear(d, 4 * d, bias=False)
        self.down_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.Wqkv(self.norm_1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.out_proj(a)
        return x + self.down_proj(F.gelu(self.up_proj(self.norm_2(x)), approximate="none"))


class MPT(nn.Module):
    def __init__(self, d: int, heads: int, layers: int):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm_f = LPLayerNorm(d, bias=False)
        self.checkpointing = False

    def gradient_checkpointing_enable(self, **_):
        """llm-foundry's activation checkpointing: each block, non-reentrant (activation_checkpointing_reentrant:
        false in the yamls)."""
        self.checkpointing = True

    def gradient_checkpointing_disable(self):
        self.checkpointing = False

    def forward(self, input_ids, labels=None):
        x = self.wte(input_ids)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.checkpointing and self.training else blk(x)
        logits = F.linear(self.norm_f(x), self.wte.weight)
        if labels is None:
            return logits
        flat, target = logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)
        with torch.autocast(flat.device.type, enabled=False):  # the fused kernel's bytes: no fp32 logits
            return F.nll_loss(F.log_softmax(flat, dim=-1), target)


def mpt_760m():
    return MPT(1536, 12, 24)


def mpt_30b():
    return MPT(7168, 56, 48)


def batch(b):
    ids = torch.randint(0, VOCAB, (b, SEQ))
    return {"input_ids": ids, "labels": ids}
