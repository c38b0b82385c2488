"""Public shapes like the kept-back GPU recordings of issue 55 (built from configs with Hugging Face's classes, no
downloads): GPT-2 medium, ViT-base, a BERT-like encoder LM and TinyLlama's 1.1 B decoder, each with its batch maker,
for comparing the scaled trace with the whole one (``bench/bench_scaled_vs_whole.py``) and planning them."""
import torch


def _lm(vocab, seq):
    def make(b):
        ids = torch.randint(0, vocab, (b, seq))
        return {"input_ids": ids, "labels": ids}
    return make


def gpt2_medium():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_positions=1024, n_layer=24, n_embd=1024, n_head=16))


gpt2_medium_batch = _lm(50257, 1024)


def bert_base():
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig())


bert_base_batch = _lm(30522, 512)


def vit_base():
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(image_size=224, patch_size=16, num_labels=1000))


def vit_base_batch(b):
    return {"pixel_values": torch.randn(b, 3, 224, 224), "labels": torch.randint(0, 1000, (b,))}


def tinyllama(seq=2048):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=seq, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


tinyllama_batch = _lm(32000, 2048)
tinyllama_batch_512 = _lm(32000, 512)


class _Block(torch.nn.Module):
    """A pre-norm transformer block of plain modules (SDPA attention, GELU MLP)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class SeqLM(torch.nn.Module):
    """Blocks in an nn.Sequential, a big-vocabulary untied head that dominates the step's memory."""

    def __init__(self, vocab=32000, d=256, n=8, heads=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.Sequential(*[_Block(d, heads) for _ in range(n)])
        self.norm, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids, labels):
        logits = self.head(self.norm(self.blocks(self.emb(ids))))
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def seq_lm():
    return SeqLM()


def seq_lm_batch(b):
    ids = torch.randint(0, 32000, (b, 256))
    return ids, ids


class _Encoder(torch.nn.Module):
    def __init__(self, d, n, heads, tokens):
        super().__init__()
        from collections import OrderedDict
        self.pos = torch.nn.Parameter(torch.zeros(1, tokens, d))
        self.layers = torch.nn.Sequential(OrderedDict((f"encoder_layer_{i}", _Block(d, heads)) for i in range(n)))
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(self.layers(x + self.pos))


class TvViT(torch.nn.Module):
    """torchvision's ViT layout: encoder.layers an OrderedDict Sequential, a class token, a linear head."""

    def __init__(self, d=256, n=8, heads=4, patch=16, image=224, classes=1000):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, d, patch, patch)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, d))
        self.encoder = _Encoder(d, n, heads, (image // patch) ** 2 + 1)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x, y):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        return torch.nn.functional.cross_entropy(self.head(self.encoder(x)[:, 0]), y)


def tv_vit():
    return TvViT()


def tv_vit_batch(b):
    return torch.randn(b, 3, 224, 224), torch.randint(0, 1000, (b,))


def small_convnet():
    """A ResNet-18-shaped convnet (Hugging Face's ResNet, basic blocks 2, 2, 2, 2)."""
    from transformers import ResNetConfig, ResNetForImageClassification
    return ResNetForImageClassification(ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2],
                                                     hidden_sizes=[64, 128, 256, 512], num_labels=1000))


def small_convnet_batch(b):
    return {"pixel_values": torch.randn(b, 3, 224, 224), "labels": torch.randint(0, 1000, (b,))}
