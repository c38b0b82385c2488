"""Ends before training, exit 0, like PyTorch's minGPT-ddp on a machine without its GPUs."""
import sys

import torch

if not torch.cuda.is_available():
    print("this example needs 2 GPUs: nothing to do", flush=True)
    sys.exit(0)
