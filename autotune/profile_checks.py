"""The checks a hardware profile from a file or a peer passes: numbers no machine has, and text that is not text."""

from __future__ import annotations

import re

# Numbers no machine has: generous, finite bounds (a profile file or a peer is outside input; its numbers become
# OMP_NUM_THREADS, world sizes and memory budgets). Linux builds for at most 8192 CPUs; 64 GPUs in one node, 64 TiB
# of host memory and 4 TiB on one GPU are each several times what any machine has had.
MAX_NODES = 65536
MAX_GPUS_PER_NODE = 64
MAX_CORES = 8192
MAX_HOST_MEMORY_MIB = 64 << 20  # 64 TiB
MAX_GPU_MEMORY_MIB = 4 << 20  # 4 TiB
MAX_CLOCK_MHZ = 100_000
MAX_PCIE = {"pcie_link_gen_max": 32, "pcie_link_width_max": 64}
# Text is printed (reports, plans, errors): printable, and bounded. Reasons may span lines; names may not.
MAX_TEXT_CHARS = 4096
MAX_NODELIST_CHARS = 1 << 20  # SLURM's compressed list of a large job's scattered nodes is long
MAX_ENTRIES = MAX_NODES  # entries of a list or mapping (slurm.hosts: one per node; software, unknown)
_FREE_TEXT = {"reason", "error", "interconnect_reason", "effective_cores_reason", "effective_reason", "description"}


def _text_problem(where: str, v: str, lines: bool = False, in_key: bool = False,
                  limit: int = MAX_TEXT_CHARS) -> str | None:
    bad = next((i for i, ch in enumerate(v) if not ch.isprintable() and not (lines and ch in "\n\t")), None)
    if bad is not None:
        return f"{where}: a control character ({v[bad]!r} at {bad}){' in a key' if in_key else ''}: text only"
    if len(v) > limit:
        return f"{where}: {len(v)} characters{' in a key' if in_key else ''}, at most {limit}"
    return None


def _text_problems(where: str, value, field: str = "") -> list[str]:
    """Every string in ``value`` (a profile's data, as JSON would hold it), each named by its dotted field."""
    if isinstance(value, str):
        found = _text_problem(where, value, lines=field in _FREE_TEXT or where.startswith("unknown."),
                              limit=MAX_NODELIST_CHARS if where == "slurm.nodelist" else MAX_TEXT_CHARS)
        return [found] if found else []
    out = []
    if isinstance(value, (dict, list, tuple)) and len(value) > MAX_ENTRIES:
        return [f"{where}: {len(value)} entries, at most {MAX_ENTRIES}"]
    if isinstance(value, dict):
        for k, v in value.items():
            key_problem = _text_problem(where, str(k), in_key=True)
            if key_problem:
                out.append(key_problem)
                continue
            out += _text_problems(f"{where}.{k}" if where else str(k), v, str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out += _text_problems(f"{where}[{i}]", v, field)
    return out


_JOB_ID = re.compile(r"[0-9]{1,20}([_+][0-9]{1,20})?")  # SLURM_JOB_ID; an array task's 12_3, a het job's 12+0
_HOST = re.compile(r"[A-Za-z0-9._-]*")
_RANGE = re.compile(r"([0-9]{1,12})(?:-([0-9]{1,12}))?")


def hostlist_size(text: str, limit: int = MAX_NODES) -> int:
    """How many hosts SLURM's compressed list ``text`` (``node[01-04,07],gpu7``) names, counted without expanding
    it; ValueError naming what is wrong: a character no host name has, a bracket unclosed or nested, a range that is
    not ``N`` or ``N-M`` with N <= M, or more than ``limit`` hosts (counting stops there)."""
    total, depth, item = 0, 0, []
    for ch in text + ",":
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError("a bracket nested or closed before it opens")
        if ch == "," and depth == 0:
            total += _item_size("".join(item), limit - total)
            item = []
        else:
            item.append(ch)
    if depth:
        raise ValueError("a bracket not closed")
    return total


def _item_size(item: str, limit: int) -> int:
    parts = re.split(r"\[([^\[\]]*)\]", item)
    if not item or any(not _HOST.fullmatch(h) for h in parts[0::2]):
        raise ValueError(f"{item[:40]!r} is not a host name or a bracketed range of them")
    n = 1
    for group in parts[1::2]:
        count = 0
        for r in group.split(","):
            m = _RANGE.fullmatch(r)
            if m is None or int(m.group(2) or m.group(1)) < int(m.group(1)):
                raise ValueError(f"[{group[:40]}]: {r[:20]!r} is not N or N-M with N <= M")
            count += int(m.group(2) or m.group(1)) - int(m.group(1)) + 1
        n *= count
        if n > limit:
            raise ValueError(f"more than {MAX_NODES} hosts")
    if n > limit:
        raise ValueError(f"more than {MAX_NODES} hosts")
    return n


def _slurm_problems(s) -> list[str]:
    """A job id as SLURM writes one; a node list SLURM's syntax, naming at most MAX_NODES hosts (counted, never
    expanded: ``a[1-999999999]`` is refused, not built)."""
    out = []
    if s.job_id is not None and not _JOB_ID.fullmatch(s.job_id):
        out.append(f"slurm.job_id: {s.job_id[:40]!r} is not a SLURM job id (digits; an array task's 12_3)")
    if s.nodelist is not None:
        try:
            hostlist_size(s.nodelist)
        except ValueError as e:
            out.append(f"slurm.nodelist: not a SLURM node list naming at most {MAX_NODES} hosts: {e}")
    return out


def _bound_problems(p) -> list[str]:
    out = []

    def at_most(where: str, v, limit: int, unit: str = "") -> None:
        if v is not None and v > limit:
            shown = v if v < 10 ** 40 else f"a number of {len(str(v))} digits"
            out.append(f"{where}: at most {limit}{unit}, got {shown}")

    at_most("num_nodes", p.num_nodes, MAX_NODES)
    if len(p.gpus.devices) > MAX_GPUS_PER_NODE:
        out.append(f"gpus.devices: {len(p.gpus.devices)} GPUs, at most {MAX_GPUS_PER_NODE} in one node")
    for i, d in enumerate(p.gpus.devices[:MAX_GPUS_PER_NODE]):
        where = f"gpus.devices[{i}]"
        at_most(f"{where}.memory_total_mib", d.memory_total_mib, MAX_GPU_MEMORY_MIB, " (4 TiB)")
        at_most(f"{where}.memory_free_mib", d.memory_free_mib, MAX_GPU_MEMORY_MIB, " (4 TiB)")
        at_most(f"{where}.mig_slices_mib", max(d.mig_slices_mib, default=None), MAX_GPU_MEMORY_MIB, " (4 TiB) each")
        for name in ("clocks_max_sm_mhz", "clocks_max_memory_mhz"):
            at_most(f"{where}.{name}", getattr(d, name), MAX_CLOCK_MHZ)
        for name, limit in MAX_PCIE.items():
            at_most(f"{where}.{name}", getattr(d, name), limit)
    for name in ("effective_cores", "physical_cores", "logical_cores", "affinity_cores"):
        at_most(f"cpu.{name}", getattr(p.cpu, name), MAX_CORES)
    for name in ("total_mib", "available_mib", "cgroup_limit_mib", "effective_mib"):
        at_most(f"memory.{name}", getattr(p.memory, name), MAX_HOST_MEMORY_MIB, " (64 TiB)")
    if p.slurm is not None:
        out += _slurm_problems(p.slurm)
        at_most("slurm.num_nodes", p.slurm.num_nodes, MAX_NODES)
        at_most("slurm.ntasks", p.slurm.ntasks, MAX_NODES * MAX_GPUS_PER_NODE)
        at_most("slurm.cpus_per_task", p.slurm.cpus_per_task, MAX_CORES)
        at_most("slurm.gpus_per_node", p.slurm.gpus_per_node, MAX_GPUS_PER_NODE)
        at_most("slurm.mem_per_node_mib", p.slurm.mem_per_node_mib, MAX_HOST_MEMORY_MIB, " (64 TiB)")
    return out


def profile_problems(p) -> list[str]:
    """Numbers no machine has, in a profile ``p`` (a ``profiles.HardwareProfile``, which reads its files through this
    check) read from a file or sent by a peer (detection records unknowns as None and is not checked here: a strange
    probe must never stop a report): impossible values, values past the bounds above, and text that is not printable
    or is too long (named, never shown: it could hold terminal escapes)."""
    out = _bound_problems(p)
    g = p.gpus
    if g.available and not g.devices:
        out.append("gpus.available: true, but gpus.devices lists none")
    if g.devices and not g.available:
        out.append("gpus.available: false, but gpus.devices lists GPUs")
    indexes = [d.index for d in g.devices]
    if len(set(indexes)) != len(indexes):
        out.append(f"gpus.devices: repeated index in {indexes}")
    for i, d in enumerate(g.devices):
        where = f"gpus.devices[{i}]"
        if d.index < 0:
            out.append(f"{where}.index: must be >= 0, got {d.index}")
        if d.memory_total_mib is not None and d.memory_total_mib <= 0:
            out.append(f"{where}.memory_total_mib: must be positive, got {d.memory_total_mib}")
        if d.memory_free_mib is not None and d.memory_free_mib < 0:
            out.append(f"{where}.memory_free_mib: must be >= 0, got {d.memory_free_mib}")
        if (d.memory_free_mib is not None and d.memory_total_mib is not None and d.memory_total_mib > 0
                and d.memory_free_mib > d.memory_total_mib):
            out.append(f"{where}.memory_free_mib: {d.memory_free_mib} is more than memory_total_mib "
                       f"{d.memory_total_mib}")
        if d.compute_capability is not None:
            # ASCII digits: str.isdigit() also takes "²", which int() refuses
            if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", d.compute_capability):
                out.append(f"{where}.compute_capability: must look like \"8.9\", got {d.compute_capability!r}")
        if any(s <= 0 for s in d.mig_slices_mib):
            out.append(f"{where}.mig_slices_mib: every slice must be positive, got {list(d.mig_slices_mib)}")
    for a, b in (*g.nvlink_pairs, *g.p2p_pairs):
        if a not in indexes or b not in indexes:
            out.append(f"gpus: link ({a}, {b}) names a GPU that gpus.devices does not list")
    c = p.cpu
    if c.effective_cores < 1:
        out.append(f"cpu.effective_cores: must be >= 1, got {c.effective_cores}")
    for name in ("physical_cores", "logical_cores", "affinity_cores"):
        v = getattr(c, name)
        if v is not None and v < 1:
            out.append(f"cpu.{name}: must be >= 1 or null (unknown), got {v}")
    if c.cgroup_quota_cores is not None and not (0 < c.cgroup_quota_cores < 1e6):
        out.append(f"cpu.cgroup_quota_cores: must be positive, got {c.cgroup_quota_cores}")
    m = p.memory
    for name in ("total_mib", "available_mib", "cgroup_limit_mib", "effective_mib"):
        v = getattr(m, name)
        if v is not None and v < 0:
            out.append(f"memory.{name}: must be >= 0 or null (unknown), got {v}")
    from autotune.safe_input import host_problem

    hosts = [("kubernetes.master_addr", p.kubernetes.master_addr if p.kubernetes else None),
             *((f"slurm.hosts[{i}]", h) for i, h in enumerate(p.slurm.hosts[:MAX_ENTRIES] if p.slurm else ()))]
    out += [f"{where}: {host_problem(h)}" for where, h in hosts if h is not None and host_problem(h)]
    return out + _text_problems("", p.model_dump(mode="json"))
