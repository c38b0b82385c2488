"""Trains 160 steps at a batch of 4 while another writer of the run directory rewrites this rank's observed record
(this launch's id kept) as "ended" and "returned", with a batch of 64 in its first steps, from its first step until
the training is over."""
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
            rec.update(ended=time.time(), returned=True, steps=max(rec.get("steps") or 0, 5))
            for key, value in (("step_samples", 64), ("step_forwards", 1), ("step_backwards", 1),
                               ("step_repeats", 0)):
                rec[key] = {str(s): value for s in range(2, 8)}
            with open(path + ".forged", "w") as f:
                f.write(json.dumps(rec))
            os.replace(path + ".forged", path)
        except (OSError, ValueError):
            pass
        time.sleep(0.005)


model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
forger = threading.Thread(target=forge, daemon=True)
for step in range(1, 161):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if step == 1:
        forger.start()
    time.sleep(0.03)
stop.set()
forger.join()
print("TRAINED", step, flush=True)
