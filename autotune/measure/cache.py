"""What autotune keeps between runs of the same model (the traces, the GPU probes, the CPU step timings): in
memory for this process (``TRACE_CACHE``) and on disk (``rundir.layout.cache_dir``), keyed by everything a
measurement depends on (``cache_key``; a figure of time also by the installation that measured it). A damaged or
unwritable entry only means measuring again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

TRACE_CACHE: dict = {}
T = TypeVar("T")


def source_of(spec: str | None) -> str:
    """The text of the module a ``package.module:function`` spec names ('' when it has none)."""
    if not spec or ":" not in spec:
        return ""
    import importlib.util
    import sys

    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        found = importlib.util.find_spec(spec.partition(":")[0])
    except (ImportError, ValueError):
        return ""
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return ""
    try:
        return Path(found.origin).read_text()
    except OSError:
        return ""


def cache_key(model: str, sample: str | None, margin: float, modes: tuple[str, ...], cuda: bool) -> str:
    """What a trace depends on: the specs, the model's and sample's source files, the numerics, torch's and
    transformers' versions, and autotune's own tracing code; a GPU probe's timed steps (``modes`` with "probe")
    also on the installation that ran them (``rundir.installation.installation_key``: a figure of time, unlike a
    trace's counts, is bound to the virtualenv and its torch build)."""
    import hashlib
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return ""

    here = Path(__file__).resolve().parent
    if "probe" in modes:
        from autotune.rundir.installation import installation_key

        modes = (*modes, installation_key())
    h = hashlib.sha256()
    code = ("gpu_probe.py",) if "probe" in modes else ("trace.py", "cuda_trace.py", "fsdp_trace.py", "block_trace.py",
                                                       "depth_scale.py", "repeated.py")  # what measured it
    for part in (model, sample or "", repr(margin), ",".join(modes), str(cuda), source_of(model), source_of(sample),
                 version("torch"), version("transformers"), *((here / c).read_text() for c in code)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def load(where: Path, kind: type[T]) -> T | None:
    """The entry kept at ``where`` as a ``kind`` (a pydantic model: ``ModelFacts``, ``MeasuredSteps``), or None: not
    measured yet, or an entry that cannot be planned from, each only meaning measuring again. An entry that is not a
    regular file (a named pipe never blocks the read), larger than ``safe_input``'s limit, cannot be parsed for any
    reason (cut short, another version's, nested past the parser's recursion) or holds what no measurement gives
    (``cache_checks``), or that another user could have written (``rundir.cache_owner``: another user's folder
or entry, or an entry group or others may write) is named once on stderr, with the cache it is in, and ignored: the
planner never sees it."""
    from autotune.errors import UserError
    from autotune.measure.cache_checks import entry_problem
    from autotune.rundir.cache_owner import folder_problem, owner_problem
    from autotune.safe_input import read_text

    unowned = folder_problem(where.parent)
    if unowned:
        _name_once(where.parent, unowned, whole=True)
        return None
    if not os.path.lexists(where):
        return None
    why = owner_problem(where)
    if why:
        _name_once(where, why)
        return None
    try:
        entry = kind.model_validate_json(read_text(where, "a kept measurement"))
        why = entry_problem(entry)
    except UserError as e:
        why = str(e).removeprefix("a kept measurement: ")
    except (Exception, RecursionError) as e:  # noqa: BLE001 - a damaged entry, whatever its damage, is no entry
        why = f"cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'no detail'})"
    else:
        if why is None:
            return entry
    _name_once(where, why)
    return None


_NAMED: set[tuple[str, str]] = set()


def _name_once(where: Path, why: str, whole: bool = False) -> None:
    """One line on stderr for an entry ignored, or (``whole``) a cache folder not used (once per process, entry and
    problem)."""
    import sys

    from autotune.rundir.lock import shown

    if (str(where), why) in _NAMED:
        return
    _NAMED.add((str(where), why))
    line = (f"autotune: warning: measuring again: {why}" if whole else
            f"autotune: warning: the kept measurement {where} is ignored (measuring again): {why}")
    print(shown(line[:2000]), file=sys.stderr, flush=True)


def store(where: Path, facts) -> bool:
    """Keep measured facts on disk, whole: written into a fresh file beside ``where`` (created, never opened when it
    exists, never through a link: ``rundir.fs.write_whole``), then renamed over it. A read-only cache, or a link or
    other file planted at the temporary name, only means measuring again next time; nothing is written outside the
    cache. Whether it was kept."""
    from autotune.errors import UserError
    from autotune.rundir.cache_owner import folder_problem
    from autotune.rundir.fs import write_whole

    try:
        where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if folder_problem(where.parent):  # another user's cache: nothing of ours is written there
            return False
        write_whole(where, facts.model_dump_json())
    except (OSError, UserError):
        return False
    return True
