"""The config fuzzer of the audit of issue 52: every field of the schema (autotune.config.TrainConfig) given each of
~70 hostile YAML values (types, huge numbers, NaN/inf, YAML 1.1 readings, tags such as !!python/object, control
characters, 5,000-character strings, self-referencing aliases), plus whole-file attacks (billion laughs, deep
nesting, duplicate keys, binary, 200,000 values), run in-process through `check` (and with `dry`, `launch --dry-run
--no_probe`). Each must exit 0, 2 (naming a field, the file or a line) or 3 (nothing fits), print no traceback and
no raw control character, and end within 20 s. Prints one line of counts, then each failure.

    .venv/bin/python bench/config_fuzz.py [check,dry]
"""

from __future__ import annotations

import contextlib
import io
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from autotune.__main__ import main
from autotune.config import TrainConfig

VALUES = [
    "", "~", "null", "0", "-1", "1e309", "-1e309", ".nan", ".inf", "-.inf", "99999999999999999999999999", "0x10",
    "0o17", "017", "1:20", "1_000", "+5", "1e3", "true", "yes", "off", "'auto'", "auto", "[]", "{}", "[1,2]",
    "{a: 1}", "!!python/object/apply:os.system ['id']", "!!python/name:os.system", "!!binary aGVsbG8=",
    "!!timestamp 2001-12-14", "2001-12-14", "!!str 5", "!!int '5'", "!!float 3", "!custom 1",
    '"\\x1b]0;pwned\\x07\\x1b[2J FAKE"', '"a\\nb"', '"\\u202e evil"', '"' + "x" * 5000 + '"', '"$(id)"', "--help",
    '"-rf"', "/dev/zero", "/proc/self/mem", '"\\0"', "&a [*a]", '"日本語"', '"%s%n"', '"{dtype}"', '"{{x}}"',
    "12:30:00", "190:20:30", "0b101", "1.", ".5", "-0", "0.0", "1e-400", '"1"', "[" * 48 + "]" * 48, '".."',
    '"../../etc/passwd"', '"\\ud800"', "2**64", "18446744073709551616", "4294967296", "65536", "65535", "29500.5",
]
_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(9))
WHOLE = [("billion laughs", _BOMB), ("laughs into a field", _BOMB + "training:\n  script_args: *j\n"),
         ("deep lists", "training:\n  script_args: " + "[" * 5000 + "]" * 5000 + "\n"),
         ("deep maps", "x: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n"),
         ("duplicate key", "training:\n  epochs: 1\n  epochs: 2\n"),
         ("merge key", "b: &b {epochs: 1}\ntraining:\n  <<: *b\n"),
         ("tab", "training:\n\tepochs: 1\n"), ("BOM", "\ufefftraining:\n  epochs: 1\n"), ("NUL", "training: {}\x00\n"),
         ("two documents", "training: {}\n---\ntraining: {}\n"), ("a list", "- 1\n- 2\n"), ("a scalar", "5\n"),
         ("empty", ""), ("binary", "\xff\xfe\x00a"), ("200,000 values", "training:\n  script_args: ["
                                                        + ",".join(["a"] * 200_000) + "]\n"),
         ("a 100,000-character key", "x" * 100_000 + ": 1\n")]
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b\u202e]")


def documents() -> list[tuple[str, str]]:
    docs = [(f"{section}.{name}: {value[:30]}", f"{section}:\n  {name}: {value}\n")
            for section, field in TrainConfig.model_fields.items() for name in field.annotation.model_fields
            for value in VALUES]
    return docs + WHOLE


def _run(argv: list[str]) -> tuple[object, str]:
    out = io.StringIO()
    signal.alarm(20)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code: object = main(argv)
            except SystemExit as e:
                code = e.code
    except TimeoutError:
        code = "no end in 20 s"
    except BaseException as e:  # noqa: BLE001 - what the fuzzer reports
        code = f"{e!r}: {traceback.format_exc()[-300:]}"
    finally:
        signal.alarm(0)
    return code, out.getvalue()


def main_fuzz(modes: list[str]) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError()))
    path = Path(tempfile.mkdtemp()) / "c.yaml"
    runs, failures, start = 0, [], time.monotonic()
    for label, text in documents():
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        for mode in modes:
            argv = ["check", "--config", str(path)] if mode == "check" else \
                ["launch", "--config", str(path), "--dry-run", "--no_probe"]
            code, printed = _run(argv)
            runs += 1
            why = [w for w, bad in (
                (f"exit {code}", code not in (0, 2, 3, None)), ("a traceback", "Traceback" in printed),
                ("a raw control character", bool(_CONTROL.search(printed))),
                ("exit 2 naming nothing", code == 2 and not re.search(r"[a-z_]+\.[a-z_]+|c\.yaml|line \d+", printed)),
            ) if bad]
            if why:
                failures.append(f"{mode} {label!r}: {', '.join(why)}")
    print(f"{runs} runs ({len(documents())} configs x {'+'.join(modes)}), {len(failures)} failures, "
          f"{time.monotonic() - start:.0f} s")
    for f in failures:
        print(f)


if __name__ == "__main__":
    main_fuzz(sys.argv[1].split(",") if len(sys.argv) > 1 else ["check"])
