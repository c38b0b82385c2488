"""Reading users' files in bounded time and memory: configs, policies, profiles, plans, metadata.

- Only regular files, at most ``MAX_BYTES`` (``/dev/zero`` or a named pipe would never end).
- YAML is scanned as events before it is built: at most ``MAX_ALIASES`` aliases (a "billion
  laughs" file is a few lines that expand to gigabytes, and any message quoting it would hang)
  and ``MAX_DEPTH`` levels of nesting (deeper files crash the parser's recursion), no alias inside the
  value it names (``&a [*a]``: a value that contains itself, endless to every reader); duplicate
  keys are an error naming both lines, never "the last one silently wins".
Every problem is a UserError (exit 2) naming the file and what to do.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UserError

MAX_BYTES = 4 << 20
MAX_ALIASES = 100
MAX_DEPTH = 32
MAX_VALUES = 100_000  # values after aliases are expanded


def read_text(path: str | Path, what: str, limit: int = MAX_BYTES, follow_links: bool = True) -> str:
    """The text of a regular file of at most ``limit`` bytes; UserError naming ``what`` otherwise. The file is
    opened without blocking and checked after opening (a named pipe swapped in after a check would hang a read);
    ``follow_links=False`` (what a run directory holds): a symbolic link is refused by name, never followed."""
    p = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise UserError(f"{what}: no such file {str(p)!r}") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise UserError(f"{what}: {str(p)!r} is a symbolic link; autotune reads only regular files here, "
                            "never a link: replace it with the file itself") from None
        raise UserError(f"{what}: cannot read {str(p)!r}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{what}: {str(p)!r} is a directory, expected a file")
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{what}: {str(p)!r} is not a regular file (a device, pipe or socket); give a file")
        if st.st_size > limit:
            raise UserError(f"{what}: {str(p)!r} is {st.st_size} bytes; the limit is {limit} (is it the right file?)")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UserError(f"{what}: cannot read {str(p)!r}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UserError(f"{what}: {str(p)!r} is larger than {limit} bytes (is it the right file?)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what}: {str(p)!r} is not UTF-8 text (byte {e.start}); is it the right file?") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""


# libyaml's parser where PyYAML has it (10-50x faster: planning reads three YAML files); errors are worded by the
# pure-Python parser, which reads the text again
_FAST = getattr(yaml, "CSafeLoader", None)


class _FastUniqueKeyLoader(_FAST or yaml.SafeLoader):  # type: ignore[misc]
    """The same, on libyaml's parser."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                    key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1}); keep one", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_FastUniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.2's floats: PyYAML (YAML 1.1) reads 3e-3 and 1E5 as text, which a strict config would then refuse; they are
# numbers as users write them
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
for _loader in (_UniqueKeyLoader, _FastUniqueKeyLoader):
    _loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


class Yaml11Int(int):
    """A number YAML 1.1 reads otherwise than it reads plainly (``1:20`` -> 80 in base 60, ``010`` -> 8 in octal), with
    ``written`` (what the file says) and ``reading`` (how YAML read it); a config refuses it by name."""


class Yaml11Float(float):
    """The same for a float (``1:20.5`` -> 80.5)."""


_OCTAL = re.compile(r"[-+]?0[0-7_]+")


def _keeping_written(construct, kind):
    def constructor(loader, node):
        value, written = construct(loader, node), str(node.value)
        reading = "a base-60 (sexagesimal) number" if ":" in written else "an octal number (its leading 0)" if (
            kind is Yaml11Int and _OCTAL.fullmatch(written)) else None
        if reading is not None:
            value = kind(value)
            value.written, value.reading = written, reading
        return value

    return constructor


for _loader in (_UniqueKeyLoader, _FastUniqueKeyLoader):
    _loader.add_constructor("tag:yaml.org,2002:int", _keeping_written(yaml.SafeLoader.construct_yaml_int, Yaml11Int))
    _loader.add_constructor("tag:yaml.org,2002:float", _keeping_written(yaml.SafeLoader.construct_yaml_float,
                                                                        Yaml11Float))


def _yaml_error(origin: str, e: yaml.YAMLError) -> UserError:
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return UserError(f"{origin}: invalid YAML{where}: {problem}")


def load_yaml(text: str, origin: str) -> Any:
    """Parse YAML text with the limits above."""
    if _FAST is not None:
        try:
            return _load_yaml(text, origin, _FAST, _FastUniqueKeyLoader)
        except (yaml.YAMLError, RecursionError):
            pass  # not valid: the pure-Python parser says why, in its words
        except ValueError as e:
            raise _number_error(origin, e) from None
    try:
        return _load_yaml(text, origin, yaml.SafeLoader, _UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise _yaml_error(origin, e) from None
    except RecursionError:
        raise UserError(f"{origin}: nested too deeply to read") from None
    except ValueError as e:  # an integer of thousands of digits (Python's conversion limit), a bad date
        raise _number_error(origin, e) from None


def _number_error(origin: str, e: ValueError) -> UserError:
    why = "a number of thousands of digits" if "digits" in str(e) else str(e)
    return UserError(f"{origin}: a value autotune cannot read ({why}); give a number of a sensible size")


def _load_yaml(text: str, origin: str, parser, loader) -> Any:
    aliases = 0
    sizes: dict[str, int] = {}  # anchor -> values it stands for, expanded
    open_: list[list] = [[None, 0]]  # [anchor, values so far] per open collection

    def add(n: int, mark) -> None:
        open_[-1][1] += n
        if sum(c[1] for c in open_) > MAX_VALUES:
            raise UserError(f"{origin}: expands to more than {MAX_VALUES} values (line {mark.line + 1}); YAML "
                            "aliases (*name) repeat what they point to: write the values out")

    for event in yaml.parse(text, Loader=parser):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise UserError(f"{origin}: more than {MAX_ALIASES} YAML aliases (*name); a config needs few: "
                                "write the values out")
            if any(c[0] == event.anchor for c in open_):  # inside what it names: a value that contains itself
                raise UserError(f"{origin}: the alias *{event.anchor} (line {event.start_mark.line + 1}) is inside "
                                f"the value &{event.anchor} it names, a value that contains itself; write the values "
                                "out")
            add(sizes.get(event.anchor, 1), event.start_mark)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor:
                sizes[event.anchor] = 1
            add(1, event.start_mark)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_.append([event.anchor, 0])
            if len(open_) - 1 > MAX_DEPTH:
                m = event.start_mark
                raise UserError(f"{origin}: nested more than {MAX_DEPTH} levels deep (line {m.line + 1}); "
                                "a config is a few sections of plain values")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, n = open_.pop()
            if anchor:
                sizes[anchor] = n + 1
            add(n + 1, event.start_mark)
    return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass


def load_json(text: str, origin: str) -> Any:
    """Parse JSON text; duplicate keys, NaN/Infinity and deep nesting are errors."""
    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise UserError(f"{origin}: duplicate key {k!r}; keep one")
            out[k] = v
        return out

    def no_constant(name: str):
        raise UserError(f"{origin}: {name} is not a number autotune accepts; give a finite value")

    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise UserError(f"{origin}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except RecursionError:
        raise UserError(f"{origin}: nested too deeply to read") from None
    except ValueError as e:  # an integer of thousands of digits (Python's conversion limit)
        raise _number_error(origin, e) from None


# -- what a value means --------------------------------------------------------------------------------------------
NAME_MAX = 255  # bytes in one path component (Linux's NAME_MAX: ext4, xfs, btrfs, tmpfs)
PATH_MAX = 4096  # bytes in a whole path with its closing NUL (Linux's PATH_MAX)
MAX_ARG_BYTES = 128 << 10  # one argument of a process (Linux's MAX_ARG_STRLEN): more and exec fails
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
MODULE_FUNCTION = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)


def control_character(text: str) -> str | None:
    """The first character of ``text`` that a terminal would act on or hide instead of showing (a newline, ESC,
    BEL, a bidi override such as U+202E: whatever ``str.isprintable`` refuses), or None."""
    return next((c for c in text if not c.isprintable()), None)


def shell_word(text: str) -> str:
    """``text`` as one word of a shell line that is printed: ``shlex.quote`` when it is printable, else bash's
    ``$'...'`` with every control character escaped (the same word when pasted, and never acted on when shown)."""
    import shlex

    if text.isprintable():
        return shlex.quote(text)
    body = "".join(c if c.isprintable() and c not in "\\'" else "\\" + c if c in "\\'" else
                   f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else
                   f"\\U{ord(c):08x}" for c in text)
    return f"$'{body}'"


def printable(word: str) -> str:
    """``word`` as a printed line may show it: itself when every character prints, else ``shell_word``'s $'...'."""
    return word if word.isprintable() else shell_word(word)


def shell_line(words) -> str:
    """``shlex.join`` for a printed line: each word by ``shell_word``."""
    return " ".join(shell_word(str(w)) for w in words)


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot name a file on this system, or None: empty, a NUL byte, a component longer than NAME_MAX
    bytes, or longer than PATH_MAX - 1 bytes in all (the system would answer "File name too long")."""
    if not value:
        return "must not be empty"
    if "\0" in value:
        return "holds a NUL byte, which no path can"
    bad = control_character(value)
    if bad is not None:
        return (f"holds the control character {bad!r} (a newline, a terminal escape or a bidi control), which a "
                "path autotune prints may not")
    try:
        raw = os.fsencode(value)
    except UnicodeEncodeError:
        return "holds characters no file name can (a lone surrogate)"
    if len(raw) >= PATH_MAX:
        return f"{len(raw)} bytes long, more than a path may be ({PATH_MAX - 1})"
    long = next((p for p in raw.split(b"/") if len(p) > NAME_MAX), None)
    if long is not None:
        return f"has a name of {len(long)} bytes, more than a file name may be ({NAME_MAX})"
    return None


def host_problem(value: str) -> str | None:
    """Why ``value`` is not a host name (letters, digits, '-' and '_' in dot-separated labels of at most 63
    characters, at most 253 in all) nor an IPv4 or IPv6 address, or None."""
    import ipaddress

    if not value:
        return "must not be empty"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    name = value.removesuffix(".")
    if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        return ("is not a host name or an IP address (letters, digits, '-' and '.'; no spaces, newlines or other "
                "characters)")
    if name.replace(".", "").isdigit():
        return "is not a host name or an IP address (all digits, yet not an IPv4 address)"
    return None


def regular_file_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a regular file this process can read, or None; opened without blocking (a named pipe
    never hangs the check), never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    return None if stat.S_ISREG(mode) else "is not a regular file (a device, pipe or socket)"


# W&B's rule for a project (wandb 0.31's Settings.validate_project): at most 128 characters, none of / \ # ? % :. The
# SDK checks no entity (a user or team name): the project's rule, and letters, digits, - _ . only. Beyond W&B's: not
# empty, no control character (it is printed), no leading - (a flag wherever it is passed on), no space at either
# end, no $ or ` (a shell that ever sees the name would run what follows).
WANDB_MAX = 128
_WANDB_FORBIDDEN = "/\\#?%:"
_WANDB_ENTITY = re.compile(r"[A-Za-z0-9_.-]+")


def wandb_name_problem(value: str, entity: bool = False) -> str | None:
    """Why ``value`` is not a W&B project (or, ``entity``, entity) name by W&B's rule and autotune's (above)."""
    what = "an entity (user or team) name" if entity else "a project name"
    shown = f"{value[:60]!r}{'...' if len(value) > 60 else ''}"  # repr: control characters escaped
    if not value.strip():
        return f"must be {what}, got {value!r} (empty); remove the key for W&B's default"
    if len(value) > WANDB_MAX:
        return f"W&B takes {what} of at most {WANDB_MAX} characters, got {len(value)} ({shown})"
    bad = control_character(value) or next((c for c in value if c in _WANDB_FORBIDDEN + "$`"), None)
    if bad is not None:
        return (f"{what} cannot hold {bad!r} (W&B refuses any of {' '.join(_WANDB_FORBIDDEN)}; autotune also "
                f"refuses control characters, $ and `), got {shown}")
    if value.startswith("-") or value != value.strip() or (entity and not _WANDB_ENTITY.fullmatch(value)):
        only = ", and is letters, digits, - _ and . only" if entity else ""
        return f"{what} cannot start with - or a space, nor end with one{only}, got {shown}"
    return None
