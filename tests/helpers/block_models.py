"""Models with repeated blocks (and without) for the scaled trace's tests (``autotune.measure.block_trace``): each
small enough to trace whole here, so that the scaled facts can be compared with the whole trace."""

import torch
import torch.nn as nn

VOCAB, SEQ = 512, 64


def gpt(n_layer: int):
    """The built-in workload's GPT (a plain nn.Module, head tied to the embedding, checkpointing by its switch)."""
    from autotune.runtime.workload import GPT

    return GPT(vocab_size=VOCAB, block_size=SEQ, n_layer=n_layer, n_head=4, n_embd=128)


def gpt2():
    return gpt(2)


def gpt4():
    return gpt(4)


def gpt12():
    return gpt(12)


def llama(n_layer: int = 6):
    """Hugging Face's Llama at a toy size (RMSNorm, RoPE, grouped KV heads, SwiGLU, untied head)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=n_layer, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def llama6():
    return llama(6)


def batch(b):
    ids = torch.randint(0, VOCAB, (b, SEQ))
    return ids, ids


def hf_batch(b):
    ids = torch.randint(0, VOCAB, (b, SEQ))
    return {"input_ids": ids, "labels": ids}


class Widening(nn.Module):
    """Blocks of one class whose widths grow: not one repeated block (traced whole)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(32 * (i + 1), 32 * (i + 2)) for i in range(6))
        self.head = nn.Linear(32 * 7, 4)

    def forward(self, x):
        for b in self.blocks:
            x = torch.relu(b(x))
        return self.head(x)


def widening():
    return Widening()


class _TinyBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyDecoder(nn.Module):
    """Few ops a block (a norm and an MLP), an embedding, a head and the loss on its logits, checkpointing by the
    Hugging Face switch: cheap to trace whole, so the tests can compare the scaled trace with it."""

    def __init__(self, n_layer: int, dim: int = 64):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(_TinyBlock(dim) for _ in range(n_layer))
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.checkpointing = False

    def gradient_checkpointing_enable(self):
        self.checkpointing = True

    def forward(self, ids, labels):
        from torch.utils.checkpoint import checkpoint

        x = self.emb(ids)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.checkpointing else b(x)
        return torch.nn.functional.cross_entropy(self.head(x).float().flatten(0, 1), labels.flatten())


def tiny2():
    return TinyDecoder(2)


def tiny4():
    return TinyDecoder(4)


def tiny12():
    return TinyDecoder(12)


class SequentialHead(nn.Module):
    """Blocks in an ``nn.Sequential`` (called whole) and a head whose logits (vocabulary 8192 at width 32) dominate the
    step: the scaled trace must keep what happens once exact while it scales the blocks."""

    def __init__(self, n_layer: int = 8, dim: int = 32, vocab: int = 8192):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(_TinyBlock(dim) for _ in range(n_layer)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.checkpointing = False

    def gradient_checkpointing_enable(self):
        self.checkpointing = True

    def forward(self, ids, labels):
        from torch.utils.checkpoint import checkpoint

        x = self.emb(ids)
        if self.checkpointing:
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        return torch.nn.functional.cross_entropy(self.head(self.norm(x)).float().flatten(0, 1), labels.flatten())


class _Encoder(nn.Module):
    def __init__(self, n_layer: int, dim: int):
        super().__init__()
        self.layer = nn.ModuleList(_TinyBlock(dim) for _ in range(n_layer))

    def forward(self, x):
        for b in self.layer:
            x = b(x)
        return x


class EncoderLM(nn.Module):
    """A BERT-like layout: the blocks in ``encoder.layer`` (a ModuleList inside a submodule), learned positions, a
    final norm and an MLM-style head."""

    def __init__(self, n_layer: int = 8, dim: int = 32):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, dim), nn.Parameter(torch.zeros(SEQ, dim))
        self.encoder = _Encoder(n_layer, dim)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB)

    def forward(self, ids, labels):
        x = self.norm(self.encoder(self.emb(ids) + self.pos))
        return torch.nn.functional.cross_entropy(self.head(x).float().flatten(0, 1), labels.flatten())


def sequential_head():
    return SequentialHead()


def sequential_head_batch(b):
    ids = torch.randint(0, 8192, (b, SEQ))
    return ids, ids


def encoder_lm():
    return EncoderLM()


class _LastAware(_TinyBlock):
    """A block that knows the model's depth: the last one (``layer_idx == depth - 1``) also applies the final norm
    (as models that fold their final norm or an extra output into the last layer do)."""

    def __init__(self, dim: int, layer_idx: int, depth: int):
        super().__init__(dim)
        self.layer_idx, self.cfg = layer_idx, {"depth": depth}  # the depth in an object: no plain setting differs

    def forward(self, x):
        x = super().forward(x)
        if self.layer_idx == self.cfg["depth"] - 1:
            x = torch.nn.functional.layer_norm(torch.cat([x, x], -1).float(), (2 * x.shape[-1],))[..., :x.shape[-1]]
        return x


class LastAware(TinyDecoder):
    def __init__(self, n_layer: int = 8, dim: int = 64):
        super().__init__(n_layer, dim)
        self.blocks = nn.ModuleList(_LastAware(dim, i, n_layer) for i in range(n_layer))


def last_aware():
    return LastAware()
