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
    enforced.

    One receiving thread serves the whole process and hands each signal to the run in progress
    (``_current``). A thread per run would outlive its run, still waiting in ``sigwait``, and
    could take the next in-process run's signal (a notebook or a test calling ``train`` twice)."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signum = 0
        self.finished = threading.Event()
        self._blocked = False

    def install(self) -> "StopRequest":
        global _current
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask"):
            _current = self
            _start_receiver()
            # Before gloo or DataLoader start threads of their own: they inherit the mask (the rank's entry,
            # autotune.train, blocked them already, before numpy's and torch's pools started with their imports).
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            self._blocked = True
        return self

    def restore(self) -> None:
        global _current
        self.finished.set()
        if self._blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            self._blocked = False
            if _current is self:
                _current = None

    def receive(self, signum: int) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT and not self.finished.is_set():
            print("autotune: second Ctrl-C: stopping now, without a checkpoint", file=sys.stderr, flush=True)
            os._exit(130)
        if self.signum or self.finished.is_set():
            return  # repeats: SLURM and torchrun both deliver one
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


_current: StopRequest | None = None  # the run whose stop signals the receiver hands on
_receiver: threading.Thread | None = None


def _start_receiver() -> None:
    """The process's one receiving thread, started blocked (a thread inherits its creator's mask, and the
    signals must reach it only through ``sigwait``)."""
    global _receiver
    if _receiver is not None and _receiver.is_alive():
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        _receiver = threading.Thread(target=_receive, daemon=True, name="autotune-signals")
        _receiver.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _receive() -> None:
    while True:
        signum = signal.sigwait(STOP_SIGNALS)
        run = _current
        if run is not None:
            run.receive(signum)
        # No run in progress: the signals are unblocked in the main thread again, which the kernel prefers for
        # a signal sent to the process; one caught here in between belongs to a run that has finished.


def ignore_stop_signals() -> None:
    """For DataLoader workers: SLURM signals every process of a job, and a worker killed by it would
    take the step down with it; the rank decides, and ends its workers itself."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # ignored now, so unblocking is safe
