"""What the CPU timing's children answer (``autotune.measure.timing._children``), made by hand: rounds of each
micro-batch with what its process got, for tests that stand in for the children."""


def answer(fb: dict[int, float], opt: float = 0.002, comm: float | None = None, *, rounds: int = 5,
           wait: float | None = 0.01, cpu: float = 0.95, threads: int = 1, slower: dict | None = None) -> dict:
    """``rounds`` rounds at each micro-batch of ``fb`` (forward + backward seconds), each round's process waiting
    ``wait`` of its time for a core; ``slower``: {round index: factor} for rounds that other work slowed."""
    out = []
    for i in range(rounds):
        f = (slower or {}).get(i, 1.0)
        for micro, s in fb.items():
            out.append({"micro": micro, "fb_s": s * f, "synced_s": s * f + (comm or 0.0), "opt_s": opt,
                        "threads": threads, "cpu_share": cpu, "wait_share": wait})
    return {"rounds": out}
