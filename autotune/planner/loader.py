"""Each process's threads (OMP_NUM_THREADS), DataLoader workers, pinning and prefetch, from the cores and RAM."""

from __future__ import annotations

from autotune.plan import LoaderSection
from autotune.planner.deciders import Inputs
from autotune.planner.resolve import Decision, Resolver


def decide_loader(inputs: Inputs, resolver: Resolver, nproc: int, on_gpu: bool) -> LoaderSection:
    """Threads per process, DataLoader workers, pinning and prefetch from effective cores and RAM."""
    cores, d, policy = inputs.hw.cpu.effective_cores, inputs.cfg.data, inputs.policy
    auto_omp = max(1, cores // nproc)
    omp_reason = (f"{cores} effective cores ({inputs.hw.cpu.effective_cores_reason}) / {nproc} process(es) per node = "
                  f"{auto_omp} thread(s) each")
    omp = resolver.resolve("omp_num_threads", d.omp_num_threads, lambda: Decision(auto_omp, omp_reason),
                           verbatim=auto_omp, verbatim_reason=omp_reason)
    # a GPU rank keeps one core; a CPU rank computes on all its threads, and a worker beside them slows its step (the
    # built-in run on 2 cores: 4,843 samples/s with 1 worker, 5,881 with none)
    kept, kept_as = (nproc, f"{nproc} kept for the rank(s)") if on_gpu else \
        (nproc * omp, f"{nproc} x {omp} thread(s) the rank(s) compute with")
    spare = max(0, cores - kept) // nproc
    auto_w = min(d.max_workers_per_process, spare)
    w_reason = (f"{auto_w} DataLoader worker(s) per process: ({cores} effective cores - {kept_as}) / {nproc} "
                f"process(es) = {spare}, capped at data.max_workers_per_process={d.max_workers_per_process}")
    workers = resolver.resolve("num_workers", d.num_workers, lambda: Decision(auto_w, w_reason), verbatim=0)
    pin = resolver.resolve("pin_memory", d.pin_memory, lambda: Decision(
        on_gpu, "pinned host memory speeds host-to-GPU copies" if on_gpu else
        "no GPU: pinning host memory would only cost RAM"), verbatim=False)
    prefetch = None
    if workers:
        ram = inputs.hw.memory.effective_mib
        per_worker = (ram / 1024) / (nproc * workers) if ram else None
        limit = policy.prefetch_ram_per_worker_gib
        if per_worker is None:
            auto = Decision(2, "2 batches prefetched per worker: effective RAM unknown: PyTorch's default 2")
        elif per_worker >= limit:
            auto = Decision(4, f"4 batches prefetched per worker: {per_worker:.1f} GiB RAM per worker >= {limit:g} GiB")
        else:
            auto = Decision(2, f"2 batches prefetched per worker: {per_worker:.1f} GiB RAM per worker < {limit:g} GiB")
        prefetch = resolver.resolve("prefetch_factor", d.prefetch_factor, lambda: auto, verbatim=2,
                                    verbatim_reason="--no_auto_optimize: PyTorch's default 2")
    else:
        resolver.explain("prefetch_factor", "no DataLoader workers, nothing to prefetch")
    return LoaderSection(num_workers=workers, pin_memory=pin, prefetch_factor=prefetch, omp_num_threads=omp)
