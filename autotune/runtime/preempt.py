"""Preemption: SIGTERM, SIGUSR1 (SLURM's ``--signal``) and SIGINT become a request to stop at the
next step boundary, agreed by every rank, so one checkpoint is written and no step is lost.

The signal may reach only some ranks (torchrun forwards it; SLURM sends it to every process; a
user may signal one rank): each rank's flag is all-reduced (MAX) after every optimizer step, so
all ranks stop after the same step. Repeats of the signal are ignored (SLURM and torchrun both
deliver one). A watchdog thread ends the process with 128+N if the grace budget runs out first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)


class StopRequest:
    """The stop signals are blocked in every thread and received by one thread in ``sigwait``:
    a Python signal handler would only run when the main thread returns to the interpreter, never
    while it waits inside a collective for a hung peer, and then the grace budget could not be
    enforced."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signum = 0
        self.finished = threading.Event()
        self._blocked = False

    def install(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask"):
            # Before torch, gloo or DataLoader start threads of their own: they inherit the mask.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            self._blocked = True
            threading.Thread(target=self._receive, daemon=True, name="autotune-signals").start()
        return self

    def restore(self) -> None:
        self.finished.set()
        if self._blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            self._blocked = False

    def _receive(self) -> None:
        while True:
            signum = signal.sigwait(STOP_SIGNALS)
            if self.signum == signal.SIGINT and signum == signal.SIGINT and not self.finished.is_set():
                print("autotune: second Ctrl-C: stopping now, without a checkpoint", file=sys.stderr, flush=True)
                os._exit(130)
            if self.signum or self.finished.is_set():
                continue  # repeats: SLURM and torchrun both deliver one
            self.signum = signum
            threading.Thread(target=self._watchdog, daemon=True, name="autotune-grace").start()

    def _watchdog(self) -> None:
        if self.finished.wait(self.grace_s):
            return
        name = signal.Signals(self.signum).name
        print(f"autotune: {name}: the step and checkpoint did not finish within checkpoint.preemption_grace_s="
              f"{self.grace_s:g}; stopping without a checkpoint", file=sys.stderr, flush=True)
        os._exit(128 + self.signum)

    def agreed(self, distributed: bool, device: torch.device) -> int:
        """The signal any rank received (0: none); a collective when distributed."""
        if not distributed or not dist.is_initialized():
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


def ignore_stop_signals() -> None:
    """For DataLoader workers: SLURM signals every process of a job, and a worker killed by it would
    take the step down with it; the rank decides, and ends its workers itself."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # ignored now, so unblocking is safe
