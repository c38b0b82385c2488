"""How each rank ended, for the launcher: torchrun reports every failure as exit 1, so each rank
writes its own code and message to a status file, and the launcher reads them."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.errors import EXIT_PREEMPTED, EXIT_REFUSED, EXIT_USAGE
from autotune.rundir.layout import RANK_FILES, STATUS_DIR, STATUS_DIR_ENV, rank_file


def status_dir(run_dir: str | Path) -> Path:
    """Where the ranks leave their statuses: the launcher's private folder (AUTOTUNE_STATUS_DIR,
    outside the run dir, so a full or read-only run dir cannot swallow them), else the run dir."""
    import os

    return Path(os.environ.get(STATUS_DIR_ENV) or Path(run_dir) / STATUS_DIR)


def status_path(run_dir: str | Path, rank: int) -> Path:
    return status_dir(run_dir) / rank_file(rank)


def write_status(run_dir: str | Path, rank: int, code: int, message: str = "", **extra) -> None:
    """Best effort: a rank that cannot write its status must still exit with its code."""
    from autotune.errors import UserError
    from autotune.rundir.fs import write_whole

    p = status_path(run_dir, rank)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_whole(p, json.dumps({"rank": rank, "code": code, "message": message[:2000], **extra}))
    except (OSError, UserError):
        pass


_NOTED: set[str] = set()  # odd entries already said (the launcher reads these folders every second)


def _note_once(text: str) -> None:
    import sys

    if text not in _NOTED:
        _NOTED.add(text)
        print(f"autotune: note: {text}", file=sys.stderr, flush=True)


MAX_RECORD_DEPTH = 32  # levels of nesting in a rank's record (its own are 3 deep; the parser's recursion ends ~1000)


def _too_deep(value, limit: int = MAX_RECORD_DEPTH) -> bool:
    """Whether ``value`` nests deeper than ``limit`` levels, walked without recursion."""
    level = [value]
    for _ in range(limit):
        level = [v for x in level if isinstance(x, (dict, list))
                 for v in (x.values() if isinstance(x, dict) else x)]
        if not level:
            return False
    return True


def read_rank_files(directory: str | Path, key: str, limit: int, note=_note_once) -> list[dict]:
    """Every rank-*.json in ``directory`` that reads as an object with an integer ``key`` (at most ``limit``
    bytes each): what ranks leave for the launcher. Only regular files are read (opened without following a link
    and without blocking, so a named pipe never hangs the launcher); a link, a pipe or a folder under such a name is
    skipped and said once through ``note``, and so is a record that cannot be read for any reason (larger than
    ``limit``, not JSON, nested past ``MAX_RECORD_DEPTH`` or the parser's recursion, an integer of thousands of
    digits, not an object with an integer ``key``): never a traceback in the launcher or a rank's watch."""
    import errno
    import os
    import stat

    d = Path(directory)
    if d.is_symlink():
        note(f"{d}: a symbolic link; autotune never follows links in a run directory: skipped")
        return []
    out = []
    for p in sorted(d.glob(RANK_FILES)) if d.is_dir() else []:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno != errno.ENOENT:  # gone: a rank replacing it this moment
                note(f"{p}: not a regular file ({'a symbolic link' if p.is_symlink() else e.strerror}); skipped")
            continue
        why = None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                note(f"{p}: not a regular file (a folder, pipe or device); skipped")
                continue
            if st.st_size > limit:
                why = f"larger than {limit} bytes"
            else:
                s = json.loads(os.read(fd, limit))
        except OSError:
            continue
        except RecursionError:
            why = "nested too deeply to read"
        except (ValueError, MemoryError) as e:
            why = f"not JSON: {str(e)[:80]}"
        finally:
            os.close(fd)
        if why is None and _too_deep(s):
            why = f"nested more than {MAX_RECORD_DEPTH} levels deep"
        elif why is None and not (isinstance(s, dict) and type(s.get(key)) is int):
            why = f"not an object with an integer {key!r}"
        if why is not None:
            note(f"{p}: not a record autotune can read ({why}); skipped")
            continue
        out.append(s)
    return out


def read_statuses(directory: str | Path) -> list[dict]:
    return read_rank_files(directory, "code", 10_000)


def combined_exit(statuses: list[dict]) -> tuple[int | None, dict | None]:
    """The code the launcher should report from its ranks' statuses, and the status that decided it:
    bad input (2), then a refusal (3), then any other failure, then a preemption (75), then success."""
    if not statuses:
        return None, None

    def rank_of(s: dict) -> tuple[int, int]:
        code = s["code"]
        order = {EXIT_USAGE: 0, EXIT_REFUSED: 1, EXIT_PREEMPTED: 3, 0: 4}.get(code, 2)
        return order, s.get("rank", 0)

    worst = min(statuses, key=rank_of)
    return worst["code"], worst


