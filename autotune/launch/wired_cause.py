"""A failed script's error, matched against the values autotune passed it (pure): a wired ``--workers 0`` that the
script's ``persistent_workers=True`` refuses, a wired ``--batch_size`` that fails the script's own assertion on its
global batch. The failure report names the value as the likely cause, and how to pass another; an error that names
none of them is left as the script's.
"""

from __future__ import annotations

import re

from autotune.exports.flag_words import NEAR_WORDS

# the plan's own setting of each value: where to plan another (a flag of autotune's, or the config's key)
PLAN_IT = {"micro_batch_size": "--batch_size", "gradient_accumulation_steps": "--grad_accum",
           "precision": "--precision", "max_steps": "--max_steps", "epochs": "--epochs",
           "learning_rate": "training.learning_rate", "num_workers": "data.num_workers",
           "warmup_steps": "training.warmup_steps"}
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?:[A-Z]\w*(?:Error|Exception)|AssertionError)\b.*$")
_FRAME = re.compile(r'^\s*File ".*", line \d+')
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:[ ]?")  # torchrun's prefix on a rank's lines
# the launcher's own error after a rank failed: never the script's
_LAUNCHER = re.compile(r"^torch\.distributed\.elastic\.|ChildFailedError")


def passed_values(cmd: list[str], delivery) -> list[tuple[str, str, str]]:
    """(plan value, flag, text passed) for each value --wire auto put on the script's command line (not the user's
    own: theirs win and are theirs)."""
    if delivery is None or not delivery.wired:
        return []
    out = []
    for key, flag in delivery.would_wire.items():
        if not flag.startswith("-") or key in (delivery.given or {}) or key not in delivery.routes:
            continue
        if not any(r.startswith("recognised") for r in delivery.routes[key]):
            continue
        for i, token in enumerate(cmd):
            if flag.endswith("=") and token.startswith(flag):
                out.append((key, flag.rstrip("="), token[len(flag):]))
            elif token == flag and i + 1 < len(cmd):
                out.append((key, flag, cmd[i + 1]))
    return out


def error_of(tail: str) -> tuple[str, str]:
    """(the exception line, the source line that raised it) of the last traceback a script wrote in ``tail``, its
    lines read without torchrun's ``[rankN]:`` prefix, torchrun's own ChildFailedError after it skipped; ('', '') if
    none."""
    lines = [_RANK_PREFIX.sub("", line) for line in tail.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if _EXCEPTION.match(lines[i].strip()) and not _LAUNCHER.search(lines[i].strip()):
            source = ""
            for j in range(i - 1, max(-1, i - 30), -1):
                if _FRAME.match(lines[j]):
                    source = lines[j + 1].strip() if j + 1 < i else ""
                    break
            return lines[i].strip(), source
    return "", ""


def likely_cause(tail: str, passed: list[tuple[str, str, str]]) -> str | None:
    """The line that names a passed value as the likely cause of the script's error, or None."""
    exception, source = error_of(tail)
    if not exception or not passed:
        return None
    text = f"{exception} {source}"
    words = set(re.split(r"[^a-z0-9]+|_", text.lower()))
    for key, flag, value in passed:
        names = {key, flag.lstrip("-").replace("-", "_")}
        near = set(NEAR_WORDS.get(key, ()))
        if any(n in text for n in names) or words & near:
            said = f"`{source}`: {exception}" if source else exception
            return (f"likely cause: autotune passed {flag} {value} (the plan's {key}), and the script's error names "
                    f"it ({said}); pass your own {flag} after `--` (yours wins), or plan another with "
                    f"{PLAN_IT.get(key, key)}")
    return None


def wired_cause(setup) -> str | None:
    """The likely cause of a failed script among the values --wire auto passed it, read from the end of the run's
    stderr log (its last 16 KiB)."""
    from autotune.rundir.layout import STDERR_LOG

    passed = passed_values(list(setup.launch_spec.cmd), setup.delivery)
    if not passed:
        return None
    import os
    import stat

    try:  # never following a link out of the run directory, nor blocking on a planted pipe
        fd = os.open(setup.records_dir / STDERR_LOG, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        f.seek(max(0, os.fstat(fd).st_size - 16384))
        tail = f.read(16384).decode(errors="replace")
    return likely_cause(tail, passed)
