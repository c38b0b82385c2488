"""Trains 160 steps while another writer of the run directory rewrites this rank's observed record as "ended" (this
launch's id kept), from step 40 until the training is over."""
import json
import os
import threading
import time

import torch
import torch.nn as nn

path = os.path.join(os.environ["AUTOTUNE_RUN_DIR"], "observed", "rank-0.json")
stop = threading.Event()


def forge():
    while not stop.is_set():
        try:
            with open(path) as f:
                rec = json.load(f)
            rec.update(ended=time.time(), returned=True)
            with open(path + ".forged", "w") as f:
                f.write(json.dumps(rec))
            os.replace(path + ".forged", path)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
forger = threading.Thread(target=forge, daemon=True)
for step in range(1, 161):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if step == 40:
        forger.start()
    time.sleep(0.03)
stop.set()
forger.join()
print("TRAINED", step, flush=True)
