"""Decoder language models at public shapes, built as plain ``nn.Module``s from their configs (no weights downloaded),
for bench/bench_plan_time.py (issue 54): what a cold plan of a large model costs, and whether the trace scaled from a
few of its blocks gives the facts the whole trace gives.

- ``mpt_7b`` / ``mpt_30b``: MosaicML's MPT shapes (mosaicml/mpt-7b and mpt-30b config.json: d_model 4096 / 7168,
  n_layers 32 / 48, n_heads 32 / 64, expansion 4, vocabulary 50,432, no biases, LayerNorm, tied head); causal SDPA
  stands in for ALiBi's flash kernel (the same tensors kept; ALiBi's bias is per head and added inside the kernel);
- ``gpt_125m`` / ``gpt_350m``: GPT-3's Small and Medium (Brown et al. 2020, table 2.1: 768 x 12 layers x 12 heads,
  1024 x 24 x 16), GPT-2's vocabulary, the same block;
- Llama 3: ``bench/torchtitan_llama.py`` (Hugging Face's LlamaForCausalLM at torchtitan's shapes); ``llama32_1b``
  here: Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json: 2048 x 16 layers, 32 heads, 8 KV heads, FFN 8192,
  tied embedding).

Batches are token ids (``batch_2048``, ``batch_8192``; ``llama_batch_*`` in Llama's vocabulary) whose labels are the
ids: one function per length, so that the trace's cache (keyed by the specs and the sources) keeps them apart.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LLAMA_VOCAB = 128256


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim, bias=False), nn.LayerNorm(dim, bias=False)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.up, self.down = nn.Linear(dim, ffn, bias=False), nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, ffn: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, bias=False)
        self.checkpointing = False

    def gradient_checkpointing_enable(self):
        self.checkpointing = True

    def gradient_checkpointing_disable(self):
        self.checkpointing = False

    def forward(self, ids, labels):
        x = self.wte(ids)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.checkpointing and self.training else blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def mpt_7b():
    return Decoder(50432, 4096, 32, 32, 4 * 4096)


def mpt_30b():
    return Decoder(50432, 7168, 48, 64, 4 * 7168)


def gpt_125m():
    return Decoder(50257, 768, 12, 12, 4 * 768)


def gpt_350m():
    return Decoder(50257, 1024, 24, 16, 4 * 1024)


def _ids(b: int, seq: int, vocab: int):
    return torch.randint(0, vocab, (b, seq))


def batch_2048(b):
    ids = _ids(b, 2048, 50257)
    return ids, ids


def batch_8192(b):
    ids = _ids(b, 8192, 50257)
    return ids, ids


def llama(dim: int, layers: int, heads: int, ffn: int, tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=8, vocab_size=LLAMA_VOCAB, max_position_embeddings=8192,
                      rope_theta=500000.0, tie_word_embeddings=tied, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def llama32_1b():
    return llama(2048, 16, 32, 8192, True)


def llama3_8b():  # the shapes of bench/torchtitan_llama.py
    return llama(4096, 32, 32, 14336, False)


def llama3_70b():
    return llama(8192, 80, 64, 28672, False)


def llama_batch_2048(b):
    ids = _ids(b, 2048, LLAMA_VOCAB)
    return {"input_ids": ids, "labels": ids}


def llama_batch_8192(b):
    ids = _ids(b, 8192, LLAMA_VOCAB)
    return {"input_ids": ids, "labels": ids}
