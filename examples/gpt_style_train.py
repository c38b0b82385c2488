"""A character-level GPT-style training script in the shape of nanoGPT's train.py (written for autotune's tests and
docs, not copied from it): its settings are module globals that --key=value arguments override (configurator.py,
exec'd like nanoGPT's), no argparse and no DataLoader (batches are sliced at random out of a memmap of tokens), its
gradient accumulation is the total over all processes (each process divides it by the world size), the warm-up
and the cosine decay are written by hand, and it runs DDP only when torchrun's RANK is set.

    python examples/gpt_style_train.py --batch_size=8 --max_iters=20
    torchrun --nproc_per_node 2 examples/gpt_style_train.py --gradient_accumulation_steps=4

Under autotune (no edit; --wire auto passes --batch_size=, --gradient_accumulation_steps= (the total),
--learning_rate= and --dtype= from the plan):

    ./launch_distributed_training.sh --config examples/gpt_style_config.yaml --nproc_per_node 2 --wire auto --strict
"""

import math
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# -- settings: each one can be given as --name=value ------------------------------------------------------------
out_dir = "out-gpt-style"
eval_interval = 10
eval_iters = 2
batch_size = 12  # sequences per process and micro-step
block_size = 16
gradient_accumulation_steps = 8  # micro-steps per iteration, in total over all processes
max_iters = 40
learning_rate = 1e-3
warmup_iters = 10
min_lr = 1e-4
n_embd = 32
vocab_size = 65
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
backend = "nccl" if torch.cuda.is_available() else "gloo"
seed = 1337
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configurator.py")).read())

# -- one process or DDP, as torchrun says ---------------------------------------------------------------------
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    torch.distributed.init_process_group(backend=backend)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if backend == "nccl" else "cpu"
    # the setting is the total: each process does its share of the micro-steps
    assert gradient_accumulation_steps % world_size == 0, "gradient_accumulation_steps must divide by the world size"
    gradient_accumulation_steps //= world_size
else:
    rank, world_size = 0, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
master = rank == 0
samples_per_iter = gradient_accumulation_steps * world_size * batch_size
if master:
    print(f"samples per iteration: {samples_per_iter} ({samples_per_iter * block_size} tokens)", flush=True)
torch.manual_seed(seed + rank)
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
autocast = torch.autocast(device.split(":")[0], dtype=ptdtype, enabled=dtype != "float32")

# -- data: a memmap of uint16 tokens (made up here: a repeating text with noise) ---------------------------------
data_path = os.path.join(tempfile.mkdtemp(prefix="gpt-style-"), "train.bin")
tokens = (np.arange(20_000) * 7 + np.random.default_rng(seed).integers(0, 3, 20_000)) % vocab_size
tokens.astype(np.uint16).tofile(data_path)


def get_batch():
    data = np.memmap(data_path, dtype=np.uint16, mode="r")  # opened per batch, as nanoGPT does (no leak)
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x.to(device), y.to(device)


# -- the model: embeddings, one causal self-attention block, a head that returns (logits, loss) ------------------
class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 2, batch_first=True)
        self.ln, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
        h = h + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        logits = self.head(self.ln(h))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))
        return logits, loss


model = TinyGPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95))
raw_model = model
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(model)


def get_lr(it):
    if it < warmup_iters:  # linear warm-up
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = min(1.0, (it - warmup_iters) / max(1, max_iters - warmup_iters))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)  # cosine down to min_lr


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = [model(*get_batch())[1].item() for _ in range(eval_iters)]
    model.train()
    return sum(losses) / len(losses)


# -- training ------------------------------------------------------------------------------------------------------
X, Y = get_batch()
t0 = time.time()
for it in range(max_iters):
    lr = get_lr(it)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if it % eval_interval == 0 and master:
        print(f"iter {it}: val loss {estimate_loss():.4f}", flush=True)
    for micro_step in range(gradient_accumulation_steps):
        if ddp:  # only the last micro-step synchronises the gradients
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with autocast:
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch()  # the next batch while this one's backward runs (on a GPU)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master and it % eval_interval == 0:
        print(f"iter {it}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}, "
              f"{(time.time() - t0) * 1000:.0f} ms", flush=True)
if master:
    print(f"trained {max_iters} iterations of {samples_per_iter} samples", flush=True)
if ddp:
    torch.distributed.destroy_process_group()
