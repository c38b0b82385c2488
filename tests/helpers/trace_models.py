"""Small models for the tracing tests (importable as helpers.trace_models:<factory>)."""

import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


class TiedLM(nn.Module):
    """A small transformer language model whose output head shares the embedding's weight."""

    def __init__(self, vocab=500, d=64, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.blocks(self.emb(x)))


def tied_lm():
    return TiedLM()


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y[y > 0]  # a shape that depends on the values: fake tensors cannot know it


def data_dependent():
    return DataDependent()


def broken():
    raise RuntimeError("no weights here")


class _CkptRaises(nn.Module):
    """Like transformers' ResNetForImageClassification: has the switch, and it raises."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))

    def gradient_checkpointing_enable(self):
        raise ValueError("this model does not support gradient checkpointing")

    def forward(self, x):
        return self.net(x)


def ckpt_raises():
    return _CkptRaises()


class _Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x)


class _ReadsValues(_Small):
    """An initialiser that reads a value (like transformers 5.24's ViT): fails under fake tensors."""

    def __init__(self):
        super().__init__()
        if self.net[0].weight.abs().max().item() > 1e9:  # a value read in the constructor
            raise AssertionError("unreachable")


def reads_values():
    return _ReadsValues()


class _InitReadsValues(_Small):
    """Reads a value only through torch.nn.init (what skipping initialisation avoids)."""

    def __init__(self):
        super().__init__()
        nn.init.normal_(self.net[0].weight, std=0.02)


def init_reads_values():
    return _InitReadsValues()


def small_gpt():
    """The built-in workload's GPT at a size whose weights matter beside its activations (FSDP2's tests)."""
    from autotune.runtime.workload import GPT

    return GPT(vocab_size=256, block_size=32, n_layer=3, n_head=4, n_embd=128)


def small_gpt_batch(b):
    import torch

    ids = torch.randint(0, 256, (b, 32))
    return ids, ids


def gpu_gpt():
    """The built-in GPT at ~0.1B parameters (the GPU tier's FSDP2 memory test)."""
    from autotune.runtime.workload import GPT

    return GPT(vocab_size=8192, block_size=512, n_layer=8, n_head=16, n_embd=1024)


def gpu_gpt_batch(b):
    import torch

    ids = torch.randint(0, 8192, (b, 512))
    return ids, ids


def deep_mlp():
    """8 x (Linear 512, LayerNorm, GELU): 2.1M parameters; its activations pass its gradients
    only above ~170 rows, far beyond the trace's first points (1..64)."""
    import torch.nn as nn

    layers = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))
