"""Llama 3 8B and 70B as torchtitan trains them, built from their configs (no weights downloaded), for
bench/bench_torchtitan.py: Hugging Face's LlamaForCausalLM at torchtitan's shapes (torchtitan/models/llama/__init__.py
at 7e76ecb: dim, layers, heads, 8 KV heads, the FFN width its multiple_of and ffn_dim_multiplier give, vocabulary
128,256, RoPE theta 500,000, untied output), SDPA attention (flash on the GPU), and batches of token ids whose
labels are the ids (the loss on fp32 logits, as torchtitan's output.float() computes it)."""
import torch

SEQ = 8192  # torchtitan's train_configs/llama3_8b.toml and llama3_70b.toml, seq_len
VOCAB = 128256


def _llama(dim: int, layers: int, heads: int, ffn: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=8, vocab_size=VOCAB, max_position_embeddings=SEQ, rope_theta=500000.0,
                      tie_word_embeddings=False, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def llama3_8b():
    return _llama(4096, 32, 32, 14336)


def llama3_70b():
    return _llama(8192, 80, 64, 28672)


def batch(b):
    ids = torch.randint(0, VOCAB, (b, SEQ))
    return {"input_ids": ids, "labels": ids}
