"""The model's own training step timed for real on this machine's CPU (imports torch, in child processes).

A plan for this machine without a GPU is timed by what its step costs here, not by a table: ``prepare`` asks
(``steps_for``) for the step of the model it plans (the built-in GPT, named by ``autotune.runtime.workload``'s
factory; a user's ``training.model`` with its ``training.sample_input``) at two micro-batches, as the plan's ranks
will run it: one child process per rank on this host (``python -m autotune.measure.timing``: the launcher imports no
torch), all at once, each with the rank's threads (the plan's ``omp_num_threads``), precision, checkpointing and
clipping, so that the ranks' contention for the cores and memory is in the figure; several ranks form a gloo group (a
file store in a temporary directory) and run the model under DDP as the ranks will. Each builds the model and, at
each micro-batch, after two warm-up steps, runs the same number of steps on every rank (at least ``MIN_REPEATS`` and
``MIN_SECONDS``, in ``ROUNDS`` rounds that take the micro-batches in turn, so that a burst of other work on the
machine falls on both alike), each an accumulation of two as the loop runs it: a micro-step without the all-reduce
(forward + backward), one with it, and the optimizer step (gradient clipping, ``AdamW.step()``, ``zero_grad``). The
figures are the slowest rank's medians of a round: forward + backward, the optimizer step, and what the synchronising
micro-step adds (the all-reduce and the wait for the slowest rank, once per optimizer step): ``MeasuredSteps``, from
which the planner draws ``a + b x micro``.

Each round's process is judged by what it got (``rundir.contention``: how long its threads waited for a core against
how long they ran), and the figures are the median quiet round's (``measure.timing_judge``). A timing whose processes
had their cores, whose rounds agree and whose larger micro-batch is not the faster is this machine's own: kept beside
the traces, keyed by everything it depends on (the request, the model's and sample's source, the installation: its
virtualenv, torch build and DeepSpeed, the CPU model, the ranks and threads, this code), and a second plan reads it.
One that did not have its cores is kept only flagged "measured under load", with when: a plan while the machine is
busy now (``contention.busy_now``) takes it and says so, one on a quiet machine times the step again, and a quiet
timing replaces it. A run's quiet measured speed replaces a flagged timing, or one it contradicts by more than 2x
(``launch.speed_check``, through ``forget``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Callable

from autotune.config import TrainConfig
from autotune.measure.child import answer, read_answer
from autotune.measure.timing_rule import times_here, why_untimed  # noqa: F401 (the rule; re-exported)
from autotune.plan import TrainingPlan
from autotune.planner.model_facts import MeasuredSteps
from autotune.profiles import HardwareProfile
from autotune.rundir.layout import TIMING_REQUEST

MIN_REPEATS, MIN_SECONDS, MAX_REPEATS = 10, 1.0, 60  # per micro-batch: enough steps for a steady median
ROUNDS = 5  # the steps of each micro-batch in this many rounds, taken in turn; the median that had its cores counts
TIMEOUT_S = 600


# the built-in GPT, built and fed by name in the children (the runtime holds the model; measure never imports it)
BUILTIN_MODEL, BUILTIN_BATCH = "autotune.runtime.workload:timed_model", "autotune.runtime.workload:timed_batch"


def steps_for(cfg: TrainConfig, hw: HardwareProfile, plan: TrainingPlan, facts) -> MeasuredSteps | None:
    """The model's step timed on this machine's CPU for ``plan`` (its ranks, threads per rank, micro-batch,
    precision, checkpointing and clipping), or None where ``why_untimed`` says why not."""
    if why_untimed(cfg, hw, plan, facts.num_parameters) is not None:
        return None
    t = cfg.training
    if t.entrypoint is None:
        what = _builtin_what(plan)
    else:
        what = _plan_what(plan, model=t.model, sample=t.sample_input, what=t.model)
    return measured_steps(cpu=hw.cpu.model_name, **what)


def _plan_what(plan: TrainingPlan, **model) -> dict:
    """``request``'s arguments for ``plan``'s ranks, threads, micro-batch, precision, checkpointing and clipping."""
    return dict(micro=plan.batch.micro_batch_size, ranks=plan.engine.nproc_per_node,
                threads=plan.loader.omp_num_threads, precision=plan.numerics.precision,
                checkpointing=plan.memory.gradient_checkpointing, clip=plan.optimizer.gradient_clipping,
                weight_decay=plan.optimizer.weight_decay, **model)


def _builtin_what(plan: TrainingPlan) -> dict:
    """The built-in GPT of ``plan``, by its shape only (the data set's size and seed change no step)."""
    d = plan.workload.data
    kw = {"workload": {"model": plan.workload.model.model_dump(),
                       "data": {"seq_len": d.seq_len, "vocab_size": d.vocab_size}}}
    return _plan_what(plan, model=BUILTIN_MODEL, sample=BUILTIN_BATCH, what="the built-in GPT", model_kwargs=kw,
                      sample_kwargs=kw)


def grid(micro: int) -> tuple[int, int]:
    """The two micro-batches timed for a plan at ``micro``: the power of two at or above it and its half (plans
    at nearby micro-batches share one timing; the line reaches ``micro`` between or at them)."""
    top = 1 << max(1, (max(1, micro) - 1).bit_length())
    return top // 2, top


def request(*, model: str, sample: str, micro: int, ranks: int, threads: int, precision: str, checkpointing: bool,
            clip: float | None, weight_decay: float, what: str, model_kwargs: dict | None = None,
            sample_kwargs: dict | None = None) -> dict:
    """What the children time: ``model`` (``package.module:factory``, called with ``model_kwargs``) on batches from
    ``sample`` (a shape spec, or ``package.module:function(batch_size, **sample_kwargs)``), ``ranks`` at once."""
    return {"model": model, "model_kwargs": model_kwargs or {}, "sample": sample, "sample_kwargs": sample_kwargs or {},
            "micro_batches": list(grid(micro)), "ranks": max(1, ranks), "threads": max(1, threads),
            "precision": precision, "checkpointing": checkpointing, "clip": clip, "weight_decay": weight_decay,
            "what": what}


def _key(req: dict, cpu: str) -> str:
    import hashlib
    from pathlib import Path

    from autotune.measure.cache import source_of
    from autotune.rundir.installation import installation_key

    h = hashlib.sha256()  # the installation: another virtualenv or torch build is another figure (issue 47)
    for part in (json.dumps(req, sort_keys=True), source_of(req["model"]), source_of(req["sample"]), installation_key(),
                 cpu, Path(__file__).read_text(), (Path(__file__).parent / "timing_judge.py").read_text()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def kept_path(req: dict, cpu: str | None):
    """Where the timing of ``req`` on ``cpu`` is kept (``rundir.layout.cache_file``)."""
    from autotune.rundir.layout import cache_file

    return cache_file("steps", _key(req, cpu or ""))


def builtin_entry(plan: TrainingPlan, hw: HardwareProfile):
    """Where the timing of ``plan``'s built-in GPT on this CPU is kept (a run's speed replaces it: ``forget``)."""
    return kept_path(request(**_builtin_what(plan)), hw.cpu.model_name)


def read_kept(where) -> MeasuredSteps | None:
    """The timing kept at ``where`` (``cache.load``), or None: not timed yet, or a damaged entry (time again)."""
    from autotune.measure.cache import load

    return load(where, MeasuredSteps)


def forget(where) -> bool:
    """Drop a kept timing (a quiet run replaced it); whether there was one."""
    try:
        where.unlink()
        return True
    except OSError:
        return False


def measured_steps(*, cpu: str | None, run: Callable[[dict], dict] | None = None, **what
                   ) -> MeasuredSteps | None:
    """The step of ``request(**what)`` timed on this CPU (``cpu``: its model name), from the cache or a child
    process (``run``: another way to run the request); None when it cannot be timed (said on stderr: the plan
    then says its time is unknown)."""
    from autotune.measure.cache import store
    from autotune.measure.timing_judge import judge
    from autotune.rundir import contention
    from autotune.rundir.cache_owner import folder_problem

    req = request(**what)
    where = kept_path(req, cpu)
    kept = read_kept(where)
    if kept is not None and kept.under_load is None:
        return kept  # this machine's own figure
    if kept is not None:  # measured under load: taken only while the machine is busy now
        busy = contention.busy_now()
        if busy:
            print(f"autotune: this machine is busy now ({busy}): the plan takes the step timing of {kept.measured_at}, "
                  f"measured under load, rather than time the step again", file=sys.stderr, flush=True)
            return kept.model_copy(update={"basis": f"{kept.basis}; taken because this machine is busy now ({busy})"})
        print(f"autotune: the step timing of {kept.measured_at} was measured under load and this machine is quiet "
              "now: timing it again", file=sys.stderr, flush=True)
    (a, b), n, ranks = req["micro_batches"], req["threads"], req["ranks"]
    who = f"{ranks} processes x {n} thread(s)" if ranks > 1 else f"{n} thread{'s' if n > 1 else ''}"
    unowned = folder_problem(where.parent)  # another user's cache: nothing is written there (rundir.cache_owner)
    kept_in = f"once, then cached in {where.parent}" if unowned is None else \
        f"not cached: {where.parent} is another user's cache, never written"
    print(f"autotune: timing {req['what']}'s training step on this CPU ({who}, micro-batch {a} and {b}; {kept_in}) ...",
          file=sys.stderr, flush=True)
    start, at = time.monotonic(), time.strftime("%Y-%m-%d %H:%M")
    try:
        timed = (run or _children)(req)
    except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        print(f"autotune: warning: {e}; the plan's time is unknown", file=sys.stderr, flush=True)
        return None
    verdict = judge(timed["rounds"], ranks, lambda r: contention.Share(
        0.0, r["cpu_share"], r.get("wait_share"), r.get("threads", n), r.get("steal_share")).under_load(),
        contention.judging())
    comm = verdict.all_reduce_s
    basis = (f"timed on this CPU ({cpu or 'model unknown'}, {who}) at micro-batch {a} and {b} on {at}: the model's own "
             "step, forward + backward and optimizer" + (", and DDP's gloo all-reduce of its gradients"
                                                         if comm is not None else "")
             + (f", the best of {ROUNDS} rounds" if verdict.under_load else
                f", the median of the {ROUNDS} rounds that had their cores"))
    if verdict.under_load:
        basis += (f"; measured under load ({verdict.under_load}): kept flagged, not as this machine's figure (a plan "
                  "while the machine is busy takes it; one on a quiet machine times the step again)")
        print(f"autotune: warning: the step was timed under load ({verdict.under_load}): kept flagged as measured "
              "under load, never as this machine's own figure", file=sys.stderr, flush=True)
    steps = MeasuredSteps(points=verdict.points, threads=n, ranks=ranks, all_reduce_s=comm, basis=basis,
                          measured_at=at, under_load=verdict.under_load)
    stored = store(where, steps)  # a quiet figure replaces one measured under load
    fb = {p[0]: p[1] for p in verdict.points}
    print(f"autotune: timed in {time.monotonic() - start:.1f} s: {fb[b] * 1000:.1f} ms a micro-step at {b}"
          + (f", {comm * 1000:.1f} ms an all-reduce" if comm is not None else "")
          + f" ({verdict.rounds})" + ("" if stored or unowned else f"; not cached: {where.parent} could not be "
                                      "written (timed again next time)"), file=sys.stderr, flush=True)
    return steps


def _children(req: dict) -> dict:
    """Run one child per rank, all at once; the slowest rank's figures. RuntimeError with a child's last words
    when one fails."""
    import os
    import tempfile
    from pathlib import Path

    env = {**os.environ, "OMP_NUM_THREADS": str(req["threads"])}
    with tempfile.TemporaryDirectory(prefix="autotune-timing-") as tmp:
        (Path(tmp) / TIMING_REQUEST).write_text(json.dumps(req))
        # each child's output to files, not pipes: a rank waited on later could fill its pipe and stop, while the
        # rank read first waits for it at the all-reduce (both stuck until TIMEOUT_S)
        logs = [(open(Path(tmp) / f"out-{rank}", "w+"), open(Path(tmp) / f"err-{rank}", "w+"))
                for rank in range(req["ranks"])]
        procs = [subprocess.Popen([sys.executable, "-m", "autotune.measure.timing", tmp, str(rank)], env=env,
                                  stdout=out, stderr=err, text=True) for rank, (out, err) in enumerate(logs)]
        answers = []
        try:
            deadline = time.monotonic() + TIMEOUT_S
            for p, (out, err) in zip(procs, logs):
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
                out.seek(0)
                err.seek(0)
                answers.append(read_answer(out.read(), err.read(), p.returncode, "timing the step failed"))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for out, err in logs:
                out.close()
                err.close()
    from autotune.measure.timing_judge import combine

    return {"rounds": combine([a["rounds"] for a in answers])}


def _measure(req: dict, store: str, rank: int) -> dict:
    import contextlib
    import datetime
    import functools
    import math
    import statistics

    import torch
    import torch.distributed as dist

    from autotune.measure.trace import _call, _loss, load_callable, sample_maker
    from autotune.rundir.contention import share_between, snapshot

    torch.set_num_threads(req["threads"])
    torch.manual_seed(0)
    ranks = req["ranks"]
    model = load_callable(req["model"], "training.model")(**req["model_kwargs"])
    model.train()
    if req["checkpointing"] and callable(getattr(model, "gradient_checkpointing_enable", None)):
        model.gradient_checkpointing_enable()
    params = [p for p in model.parameters() if p.requires_grad]
    run = model
    if ranks > 1:  # the ranks time together, as DDP over gloo (their contention and waits are the run's)
        dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=rank, world_size=ranks,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        run = torch.nn.parallel.DistributedDataParallel(model)
    make = (functools.partial(load_callable(req["sample"], "training.sample_input"), **req["sample_kwargs"])
            if req["sample_kwargs"] else sample_maker(req["sample"]))
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=req["weight_decay"])
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(req["precision"])
    cast = torch.autocast("cpu", dtype=half) if half is not None else contextlib.nullcontext()

    def forward_backward(batch, sync: bool) -> float:
        t0 = time.perf_counter()
        with contextlib.nullcontext() if sync or ranks == 1 else run.no_sync():
            with cast:
                loss = _loss(_call(run, batch))
            loss.backward()
        return time.perf_counter() - t0

    def optimizer_step() -> float:
        t0 = time.perf_counter()
        if req["clip"]:
            torch.nn.utils.clip_grad_norm_(params, req["clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def step(batch) -> tuple[float, float, float]:
        """An accumulation of two micro-steps as the loop runs it: (without the gradients' all-reduce, with it,
        the optimizer step)."""
        return forward_backward(batch, False), forward_backward(batch, True), optimizer_step()

    micros = req["micro_batches"]
    batches = {b: make(b) for b in micros}
    first = [[step(batches[b]) for _ in range(2)][-1] for b in micros]  # warm-up: optimizer state, allocator
    repeats = min(MAX_REPEATS, max(MIN_REPEATS, math.ceil(MIN_SECONDS / max(sum(first[-1]), 1e-6))))
    if ranks > 1:  # every rank the same number of steps (each waits for the others at the all-reduce)
        agreed = torch.tensor([repeats])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        repeats = int(agreed)
    rounds = []
    per_round = -(-repeats // ROUNDS)  # at least 2 (MIN_REPEATS); more where a step is quick
    for _ in range(ROUNDS):  # in rounds, the micro-batches in turn: a burst of other work hits both alike
        for b in micros:
            before = snapshot()  # what this process gets meanwhile: did it have its cores?
            times = [step(batches[b]) for _ in range(per_round)]
            got = share_between(before, snapshot(), req["threads"])
            fb, synced, optimizer = (statistics.median(t[i] for t in times) for i in range(3))
            rounds.append({"micro": b, "fb_s": fb, "synced_s": synced, "opt_s": optimizer, "threads": got.threads,
                           "cpu_share": got.cpu_share, "wait_share": got.wait_share, "steal_share": got.steal_share})
    if ranks > 1:
        dist.destroy_process_group()
    return {"rounds": rounds}


def _main() -> int:
    from pathlib import Path

    tmp, rank = sys.argv[1], int(sys.argv[2])
    req = json.loads((Path(tmp) / TIMING_REQUEST).read_text())
    return answer(lambda: _measure(req, tmp, rank), "timing the step failed")


if __name__ == "__main__":
    raise SystemExit(_main())
