"""The secret rule's two lists (issue 52): ordinary script arguments people pass (none may be taken for a secret) and
the attack list (every one must be). Deterministic: generated with fixed seeds, plus values copied from public
scripts, configs and docs (model ids, a few published SRI values, IPFS's own example CIDs).

`python bench/secret_corpus.py` writes tests/data/ordinary_args.txt (one argument a line), which the unit tests
read; `bench/secret_rule.py` scores the rule on both lists."""

from __future__ import annotations

import base64
import hashlib
import random
import uuid
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "ordinary_args.txt"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

# Hugging Face model ids as model cards and training scripts name them
MODEL_IDS = [
    "meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct",
    "mistralai/Mistral-7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1", "google/gemma-2-9b-it", "google/flan-t5-xxl",
    "google/vit-base-patch16-224-in21k", "google-bert/bert-base-uncased", "FacebookAI/roberta-large",
    "facebook/opt-1.3b", "facebook/bart-large-cnn", "EleutherAI/gpt-neox-20b", "EleutherAI/pythia-6.9b-deduped",
    "bigscience/bloom-560m", "tiiuae/falcon-40b-instruct", "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2-VL-7B-Instruct",
    "microsoft/phi-2", "microsoft/Phi-3-mini-4k-instruct", "microsoft/deberta-v3-large", "openai/whisper-large-v3",
    "openai/clip-vit-large-patch14-336", "stabilityai/stable-diffusion-xl-base-1.0", "HuggingFaceTB/SmolLM2-1.7B",
    "HuggingFaceH4/zephyr-7b-beta", "allenai/OLMo-7B-0724-hf", "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF", "sentence-transformers/all-MiniLM-L6-v2",
    "TheBloke/Llama-2-13B-chat-GPTQ", "NousResearch/Hermes-3-Llama-3.1-8B", "databricks/dolly-v2-12b",
    "Salesforce/blip2-opt-2.7b", "timm/resnet50.a1_in1k", "timm/vit_base_patch16_clip_224.openai_ft_in12k_in1k",
    "openai-community/gpt2-medium", "distilbert/distilbert-base-uncased-finetuned-sst-2-english",
    "HuggingFaceFW/fineweb-edu", "allenai/c4", "wikitext-103-raw-v1", "Salesforce/wikitext", "tatsu-lab/alpaca",
]
# published values: IPFS's docs' example CIDs, jsDelivr/Bootstrap-style SRI attributes, container digests
PUBLISHED = [
    "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG", "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o",
    "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi",
    "ipfs://bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi/readme",
    "sha384-9ndCyUaIbzAi2FUVXJi0CjmCapSmO7SnpJef0486qhLnuZ2cdeRhO02iuK6FUUVM",
    "sha384-oBqDVmMz9ATKxIep9tiCxS/Z9fNfEXiDAYTujMAeBAsjFuCZSmKbSSUnQlmh/jp3",
    "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
    "nvcr.io/nvidia/pytorch:24.05-py3@sha256:3ab6e8dcd1e5bd8e5d2fd1f2bfc7b2a3a1e1e0d4c4d1f6a1e2b3c4d5e6f7a8b9",
    "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "ghcr.io/huggingface/text-generation-inference:2.0.4",
    "ssh://git@github.com/org/repo.git", "git@github.com:huggingface/transformers.git",
    "git+https://github.com/huggingface/peft.git@v0.11.1#egg=peft",
    "https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main/sample/10BT/000_00000.parquet",
    "https://download.pytorch.org/whl/cu121", "https://github.com/karpathy/nanoGPT/blob/master/train.py#L42",
    "s3://my-Bucket-2024/datasets/OpenWebText2/shard-00001-of-01024.tar", "gs://gcp-public-data/imagenet/train-00042",
    "hf://datasets/allenai/c4/en/c4-train.00001-of-01024.json.gz", "redis://redis:6379/0", "tcp://10.1.2.3:29500",
    "http://localhost:8265", "wandb://entity/project/runs/3k9x2abc", "--host=alice@login.cluster.example.edu",
    "trainer.max_epochs=3", "+experiment=llama3_8b_sft", "model.optim.lr=3e-4", "+model={name:gpt2,layers:12}",
    "trainer.devices=[0,1,2,3]", "data.tokenizer=meta-llama/Llama-2-7b-hf", "--deepspeed=ds_zero3_offload.json",
    "--report_to=wandb", "--lr_scheduler_type=cosine_with_restarts", "--max_tokens", "--pad_token", "<|endoftext|>",
    "--time", "12:30:00", "--nodelist", "gpu[001-016]", "1000:1000", "alice@example.com",
]
# the audit of issue 52: ordinary values it tried that no list above had (class names, tokenizer and dataset names,
# schedules, dates, revisions, digests, choices, where secrets are kept, argument strings, free text)
AUDIT_ORDINARY = [
    "LlamaForCausalLM", "GPTNeoXForCausalLM", "Qwen2VLForConditionalGeneration", "MistralForSequenceClassification",
    "XLMRobertaForTokenClassification", "Wav2Vec2ForCTC", "LlavaNextForConditionalGeneration", "c4/en",
    "allenai/c4:en", "EleutherAI/the_pile_deduplicated", "HuggingFaceH4/ultrachat_200k", "2024-05-01",
    "2024-05-01T12:30:00Z", "2024-05-01T12:30:00+02:00", "20240501-123000", "cosine_with_min_lr", "linear:0.1:1e-5",
    "warmup_stable_decay", "pytorch_model-00002-of-00003.bin", "tokenizer.json", "sentencepiece.bpe.model",
    "meta-llama/Llama-2-7b-hf@6fdf2e60f86ff2481f2241aaee459f85b5b0bbb9",
    "--revision=6fdf2e60f86ff2481f2241aaee459f85b5b0bbb9", "1.2.3-alpha.1+exp.sha.5114f85",
    "docker.io/library/ubuntu@sha256:2b7412e6465c3c7fc5bb21d3e6f1917c167358449fecac8176c6e496e5c1f05f",
    "--optim=adamw_torch_fused", "--precision=bf16-mixed", "--strategy=deepspeed_stage_3_offload",
    "--token_file=/run/secrets/hf", "--password_file=/run/secrets/db", "--secret_name=my-k8s-secret",
    "--secrets_dir=/run/secrets", "--hf_token_path=~/.cache/huggingface/token", "--api_key_env=OPENAI_API_KEY",
    '{"lr": 0.001, "scheduler": "cosine", "tokenizer": "gpt2"}', '{"model": {"name": "gpt2", "layers": 12}}',
    "--lr 1 --max_tokens 512 --pad_token <pad>", "python train.py --key_column text --token_budget 4096",
    "What is the password policy for new users?", "the Bearer of bad news", "https://host/docs#section=3",
    "//cdn.example.com/lib.js", "https://example.com/?a=1&amp;b=2", "caf\\u00e9", "ｒｕｎ＿ｎａｍｅ",
    "aGVsbG8gd29ybGQsIGEgY2FwdGlvbg==", "-----BEGIN PUBLIC KEY-----",
]
WORDS = ["gpt", "llama", "resnet", "vit", "bert", "t5", "whisper", "clip", "mistral", "medium", "large", "small",
         "base", "tiny", "finetuned", "pretrain", "sft", "dpo", "lora", "qlora", "instruct", "chat", "wiki", "text",
         "image", "net", "web", "crawl", "code", "math", "warmup", "cosine", "decay", "seed", "epoch", "step", "batch",
         "shard", "mixed", "precision", "baseline", "ablation", "sweep", "trial", "final", "best", "last", "eval"]
ABBREVIATIONS = ["lr", "bs", "ep", "wd", "ga", "seq", "ctx", "res", "ckpt", "gpu", "fp", "bf", "in", "ft", "v"]


def _b58(data: bytes) -> str:
    n, out = int.from_bytes(data, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _run_name(rng: random.Random) -> str:
    """A CamelCase or snake_case run name of words, abbreviations and numbers (nothing drawn at random per letter)."""
    parts = []
    for _ in range(rng.randint(4, 9)):
        word = rng.choice(WORDS) if rng.random() < 0.6 else rng.choice(ABBREVIATIONS)
        number = str(rng.choice([1, 2, 3, 7, 8, 13, 16, 32, 50, 70, 101, 103, 256, 345, 512, 1024, 4096, 2024]))
        parts.append(word + (number if rng.random() < 0.5 else "") + ("M" if rng.random() < 0.05 else ""))
    if rng.random() < 0.7:
        return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])
    return "_".join(parts)


def ordinary_args() -> list[str]:
    """At least 500 ordinary arguments: checksums (hex, base64, SRI) of random bytes, UUIDs, git shas, CIDs, run
    names, model ids, paths and URLs without credentials, with fixed seeds."""
    rng = random.Random(52)
    out: list[str] = []
    for i in range(60):
        data = rng.randbytes(rng.randint(1, 4096))
        out.append(hashlib.sha256(data).hexdigest() if i % 3 else hashlib.md5(data).hexdigest())
        out.append(hashlib.sha1(data).hexdigest()[: 7 if i % 2 else 40])  # git's short and full shas
    for i in range(120):  # base64 digests as `openssl dgst -binary | base64` and checksum files write them
        data = rng.randbytes(rng.randint(1, 4096))
        algo = ("sha256", "sha256", "sha512", "sha1", "md5", "sha384")[i % 6]
        out.append(base64.b64encode(hashlib.new(algo, data).digest()).decode())
    for i in range(90):  # Subresource Integrity: sha256- / sha384- / sha512- then base64
        data = rng.randbytes(rng.randint(1, 4096))
        algo = ("sha256", "sha384", "sha512")[i % 3]
        out.append(f"{algo}-{base64.b64encode(hashlib.new(algo, data).digest()).decode()}")
    for _ in range(20):  # IPFS CIDs: v0 (base58 of a SHA-256 multihash), v1 (base32, dag-pb)
        digest = hashlib.sha256(rng.randbytes(64)).digest()
        out.append(_b58(b"\x12\x20" + digest))
        out.append("b" + base64.b32encode(b"\x01\x70\x12\x20" + digest).decode().lower().rstrip("="))
    out += [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(40)]
    out += [_run_name(rng) for _ in range(120)]
    out += ["gpt2Medium345MFinetunedOnWikiText103v2", "resnet50v2ImageNet1kBs256Lr0p1Ep90"]  # the two
    out += MODEL_IDS + PUBLISHED + AUDIT_ORDINARY
    for i in range(40):  # the audit of issue 52: more digests and ids of random bytes
        digest = hashlib.sha256(rng.randbytes(64)).digest()
        out.append(hashlib.sha1(digest).hexdigest() if i % 2 else hashlib.sha512(digest).hexdigest())
        out.append(base64.urlsafe_b64encode(digest).decode())  # base64url with its padding, as encoders write it
        out.append("z" + _b58(bytes([1, 0x55 if i % 2 else 0x70, 0x12, 0x20]) + digest))  # CIDv1, base58btc
        out.append(("m" if i % 2 else "u") + (base64.b64encode if i % 2 else base64.urlsafe_b64encode)(
            b"\x01\x55\x12\x20" + digest).decode().rstrip("="))  # CIDv1, multibase base64 / base64url
        out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8)))  # a W&B run id
        out.append(f"model-{i + 1:05d}-of-{40:05d}.safetensors")
        out.append(f"s3://bucket-{i}/ckpt/{hashlib.md5(digest).hexdigest()}/step_{i * 1000}/")
        out.append(f"v{i % 4}.{i % 11}.{i}-rc.{i % 3}+build.{digest.hex()[:7]}")
    for i in range(40):
        run = f"{20260101 + i}-{rng.randint(0, 235959):06d}-{rng.getrandbits(24):06x}"
        out.append(["runs/{}/checkpoints/step_{:08d}", "/scratch/$USER/{}/ckpt-{}", "outputs/{}/epoch={}"][i % 3]
                   .format(run, rng.randint(1, 10 ** 6)))
    return out


def attack_cases() -> list[tuple[list[str], str]]:
    """Every secret form the rule must catch, with the secret each carries (issue 44's list, issue 52's forms, and
    random tokens of the shapes issuers use)."""
    rng = random.Random(5252)
    b62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    cases = [
        (["-p", "PW-a"], "PW-a"), (["--hf", "PW-b"], "PW-b"), (["--bearer", "PW-c"], "PW-c"),
        (["--sas_url", "https://a.blob.core.windows.net/c?sv=1&sig=PW-d"], "PW-d"), (["--token:", "PW-e"], "PW-e"),
        (["--api_key=PW-f"], "PW-f"), (["--hub_token PW-g"], "PW-g"), (["db.password=PW-h"], "PW-h"),
        (["++db.password=PW-i"], "PW-i"), (["--data", "https://alice:PW-j@example.com/d"], "PW-j"),
        (["--db", "mongodb://admin:PW/k@db:27017"], "PW/k"), (["--login", "alice:PW-l"], "PW-l"),
        (["--header", "Authorization: Bearer PW-m-0123456789abcdef"], "PW-m-0123456789abcdef"),
        (["-pPW-n"], "PW-n"), (["--api_keys", "PW-o1", "PW-o2"], "PW-o2"), (["--token=", "PW-p"], "PW-p"),
        # issue 52: decoded before judged
        (["+db={user:alice,password:PW-q}"], "PW-q"), (["+db={{user:alice,password:PW-r}}"], "PW-r"),
        (["'+db.password=PW-s'"], "PW-s"), (["--u", "https%3A%2F%2Falice%3APW-t%40example.com"], "PW-t"),
        (["--u", "https%253A%252F%252Falice%253APW-u%2540example.com"], "PW-u"),
        (["--next", "https://sso.example.com/?to=https%3A%2F%2Fbob%3APW-v%40db%2Fx"], "PW-v"),
        (["--redis", "alice:PW-w@redis:6379"], "PW-w"), (["--remote", "alice:PW-x@host"], "PW-x"),
        (["--token2", "PW-y"], "PW-y"), (["--api_key2", "PW-z"], "PW-z"), (["--api-key-b", "PW-A"], "PW-A"),
        (["-ualice:PW-B"], "PW-B"), (["Bearer", "PW-C-token"], "PW-C-token"),
        (["--private_key_pem", "PW-D"], "PW-D"),
        # the audit of issue 52: other encodings, nested values, argument strings
        (["--url", "https://alice&#58;PW-E&#64;host/x"], "PW-E"), (["--blob", "password\\u003dPW-F"], "PW-F"),
        (["--url", "https://alice\\x3aPW-G\\x40host/x"], "PW-G"), (["--url", "https://alice：PW-H＠host/x"], "PW-H"),
        (["--tok\u200ben", "PW-I"], "PW-I"), (["—token", "PW-J"], "PW-J"), (["--ｔｏｋｅｎ", "PW-K"], "PW-K"),
        (["--blob", base64.b64encode(b"alice:PW-L").decode()], base64.b64encode(b"alice:PW-L").decode()),
        (["--config_json", '{"db": {"password": "PW-M"}}'], "PW-M"), (["+db=[{password:PW-N}]"], "PW-N"),
        (["--url", "https://host/cb#access_token=PW-O"], "PW-O"), (["--url", "//alice:PW-P@host/"], "PW-P"),
        (["--redis", ":PW-Q@redis:6379"], "PW-Q"), (["--blob", "-----BEGIN PGP PRIVATE KEY BLOCK-----\nPW-R"], "PW-R"),
        (["--args", "--lr 1 --password PW-S"], "PW-S"), (["--cmd", "mysql -u root -pPW-T"], "PW-T"),
        (["--cmd", "curl -u alice:PW-U host"], "PW-U"),
    ]
    for i in range(40):  # tokens of issuers' shapes, and long random strings under innocent names
        tokens = ["hf_" + "".join(rng.choice(b62) for _ in range(34)),
                  "ghp_" + "".join(rng.choice(b62) for _ in range(36)),
                  "sk-proj-" + "".join(rng.choice(b62) for _ in range(40)),
                  "".join(rng.choice(b62) for _ in range(40))]
        token = tokens[i % 4]
        cases.append((["--blob", token], token))
    return cases


if __name__ == "__main__":
    args = ordinary_args()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(a + "\n" for a in args))
    print(f"{len(args)} ordinary arguments -> {OUT}")
