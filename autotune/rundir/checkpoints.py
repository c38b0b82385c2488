"""Checkpoint discovery and compatibility checks without importing torch: the launcher
runs them before any rank starts, so a wrong --resume_from fails fast with exit 2. A checkpoint is
data: its torch files' pickles are read as opcodes (never unpickled), and one that would create
anything but tensors and plain values is refused by name; so are links and odd entries in it. FSDP2's
DCP metadata (fsdp/.metadata) is unpickled into stand-ins of DCP's own classes only, and each file it
sends data to must be a plain name of a regular file in fsdp/ (``rundir.sharded``)."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.errors import UserError
from autotune.rundir.layout import CHECKPOINT_META, CHECKPOINT_PREFIX, CHECKSUMS, RNG_PREFIX, checkpoint_dir
from autotune.rundir.sharded import DCP_METADATA, SHARDED_DIR, dcp_storage_files, sharded_backend


def list_checkpoints(run_dir: str | Path, note=None) -> list[Path]:
    """The run's finished checkpoints, oldest first: folders ``step-<number>`` holding a meta.json. An odd entry
    under such a name (``step-best``, a file, a named pipe, a symbolic link, dangling or not) is not one autotune
    wrote: skipped, and said through ``note`` when given (never followed, never a traceback)."""
    ckpt_dir = checkpoint_dir(run_dir)
    if ckpt_dir.is_symlink() or not ckpt_dir.is_dir():
        if ckpt_dir.is_symlink() and note is not None:
            note(f"{ckpt_dir}: a symbolic link; autotune never follows links in a run directory: no checkpoint read")
        return []
    done = []
    for p in sorted(ckpt_dir.iterdir()):
        if not p.name.startswith(CHECKPOINT_PREFIX) or p.name.endswith(".tmp"):
            continue
        odd = ("a symbolic link" if p.is_symlink() else "not a folder" if not p.is_dir()
               else "not a step number" if checkpoint_step(p) is None else None)
        if odd is not None:
            if note is not None:
                note(f"{p}: {odd}, not a checkpoint autotune wrote; skipped")
            continue
        meta = p / CHECKPOINT_META
        if meta.is_file() and not meta.is_symlink():
            done.append(p)
    return sorted(done, key=checkpoint_step)


def checkpoint_step(path: Path) -> int | None:
    """The step in a checkpoint's name (``step-00000100``: 100); None for another name (``step-best``)."""
    digits = path.name[len(CHECKPOINT_PREFIX):] if path.name.startswith(CHECKPOINT_PREFIX) else ""
    return int(digits) if digits.isascii() and digits.isdigit() else None


def later_than(run_dir: str | Path, resume: str | Path) -> list[Path]:
    """The run dir's checkpoints after ``resume`` (one of them): an abandoned continuation when a run
    resumes from an older one."""
    resume = Path(resume).resolve()
    if resume.parent != checkpoint_dir(run_dir).resolve():
        return []  # resuming from another run's checkpoint: this run's own are not in its line
    step = checkpoint_step(resume)
    if step is None:
        return []  # not named like this run's checkpoints: none of them is after it
    return [c for c in list_checkpoints(run_dir) if checkpoint_step(c) > step]


def set_aside(run_dir: str | Path, checkpoints: list[Path], stamp: str) -> Path | None:
    """Move ``checkpoints`` to <run_dir>/checkpoints/abandoned-<stamp>/ (kept, never deleted): the newest
    checkpoint of the run dir is then the run's own again, for --resume_from auto and for restarts."""
    if not checkpoints:
        return None
    dest = checkpoint_dir(run_dir) / f"abandoned-{stamp}"
    dest.mkdir(parents=True, exist_ok=True)
    for c in checkpoints:
        c.rename(dest / c.name)
    return dest


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_meta(path: str | Path) -> dict:
    p = Path(path)
    meta_file = p / CHECKPOINT_META
    if not meta_file.exists():
        raise UserError(f"--resume_from: {p} is not an autotune checkpoint (no {CHECKPOINT_META}); "
                        "checkpoints live in <run_dir>/checkpoints/step-NNNNNNNN")
    from autotune.safe_input import load_json, read_text

    return load_json(read_text(meta_file, "--resume_from", follow_links=False), f"--resume_from: {meta_file}")


def check_compatible(meta: dict, path: str | Path, backend: str, global_batch_size: int) -> None:
    """A checkpoint continues a run only with the same engine family and global batch. Torch's engines are one
    family: single, DDP and FSDP2 read each other's checkpoints (whole weights and optimizer state, or FSDP2's
    DCP shards, which any world size reads back); DeepSpeed's own checkpoint is another."""
    saved_by = meta.get("backend")
    if (saved_by == "deepspeed") != (backend == "deepspeed"):
        raise UserError(
            f"--resume_from: {path} was written by the {saved_by} backend and this run uses {backend}; "
            f"resume with the same engine family "
            f"({'--deepspeed' if saved_by == 'deepspeed' else '--ddp, --fsdp or --single'})"
        )
    if meta.get("global_batch_size") != global_batch_size:
        raise UserError(
            f"--resume_from: {path} was trained with global batch {meta.get('global_batch_size')}, this plan has "
            f"{global_batch_size}; set --global_batch_size {meta.get('global_batch_size')} to continue the same run"
        )


# ---- verified checkpoints ------------------------------------------------------------------------
META_KEYS = ("step", "micro_batches_consumed", "backend", "world_size", "global_batch_size")


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checkpoint_files(ckpt: Path) -> list[str]:
    """Every file of a checkpoint but the checksum list itself, relative, sorted (same on every rank)."""
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def check_files(ckpt: Path, expected: dict, names: list[str]) -> list[str]:
    """Problems with ``names`` (a share of the checkpoint's files) against ``expected``."""
    problems = []
    for name in names:
        want = expected.get(name)
        p = ckpt / name
        if not p.is_file():
            problems.append(f"{p}: missing")
        elif want is None:
            continue
        elif p.stat().st_size != want["bytes"]:
            problems.append(f"{p}: {p.stat().st_size} bytes, {want['bytes']} when written (truncated or changed)")
        elif file_digest(p) != want["sha256"]:
            problems.append(f"{p}: checksum differs from when it was written (damaged)")
    return problems


def read_checksums(ckpt: Path) -> dict | None:
    """The checkpoint's recorded checksums; None for a checkpoint written before they existed."""
    f = ckpt / CHECKSUMS
    if not f.exists():
        return None
    from autotune.safe_input import load_json, read_text

    damaged = UserError(f"--resume_from: {f} is damaged (not the checksum list autotune wrote)")
    try:
        files = load_json(read_text(f, "--resume_from", follow_links=False), str(f))["files"]
    except (UserError, KeyError, TypeError):
        raise damaged from None
    if not (isinstance(files, dict) and all(isinstance(v, dict) and {"bytes", "sha256"} <= v.keys()
                                            for v in files.values())):
        raise damaged
    return files


def meta_problems(ckpt: Path) -> list[str]:
    try:
        meta = read_meta(ckpt)
    except UserError as e:
        return [str(e).removeprefix("--resume_from: ")]
    if not isinstance(meta, dict):
        return [f"{ckpt / CHECKPOINT_META}: not a JSON object"]
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        return [f"{ckpt / CHECKPOINT_META}: missing {', '.join(missing)}"]
    bad = [k for k in ("step", "micro_batches_consumed", "world_size", "global_batch_size")
           if not isinstance(meta[k], int) or isinstance(meta[k], bool) or meta[k] < 0]
    if bad:
        return [f"{ckpt / CHECKPOINT_META}: {', '.join(bad)} must be non-negative integers"]
    return []


def verify_checkpoint(ckpt: Path, trust: bool = False) -> list[str]:
    """Every sign of damage in ``ckpt`` (empty: good): meta.json, the size and SHA-256 of every file, and a file the
    checksum list does not name (a checkpoint with no list at all passes only with ``trust``). What no
    damage explains is refused instead (``refuse_untrusted``: a UserError, exit 2): a link or odd entry, a pickled
    object that is not data, and, unless ``trust``, a checkpoint without its checksum list."""
    problems = meta_problems(ckpt)
    if problems:
        return problems
    unreadable = refuse_untrusted(ckpt)
    try:
        expected = read_checksums(ckpt)
    except UserError as e:
        return [str(e).removeprefix("--resume_from: ")]
    if expected is None:
        if trust:
            return unreadable
        raise UserError(f"--resume_from: {ckpt / CHECKSUMS} is missing: autotune writes one into every checkpoint, "
                        "so this one was written by an older autotune or changed since; resume from it only if you "
                        "trust where it came from (--trust_checkpoint), or choose another checkpoint")
    return check_files(ckpt, expected, sorted(expected)) + unlisted_files(ckpt, expected) or unreadable


def unlisted_files(ckpt: Path, expected: dict) -> list[str]:
    """The files of ``ckpt`` its checksum list does not name: autotune lists every file it wrote (DeepSpeed's
    engine/ and FSDP2's fsdp/ included) before the folder gets its name, so one more was added since."""
    return [f"{ckpt / name}: not in {CHECKSUMS}: added since the checkpoint was written; remove it or resume from "
            "another checkpoint" for name in checkpoint_files(ckpt) if name not in expected]


def newest_good_checkpoint(run_dir: str | Path, warn=None, trust: bool = False) -> Path | None:
    """The newest checkpoint that verifies; each damaged newer one, and each odd entry of the checkpoints folder,
    is reported through ``warn``. A checkpoint refused outright (``verify_checkpoint``) stops the search."""
    for ckpt in reversed(list_checkpoints(run_dir, note=warn)):
        problems = verify_checkpoint(ckpt, trust)
        if not problems:
            return ckpt
        if warn is not None:
            warn(f"checkpoint {ckpt.name} is damaged and skipped: {problems[0]}"
                 + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return None


# ---- a checkpoint is data: what its pickles would create, read without unpickling (no torch here) --------------
# What torch.save writes for tensors and plain containers: torch's own weights_only allowlist (torch/
# _weights_only_unpickler.py, _get_allowed_globals), which the ranks load with (weights_only=True).
SAFE_GLOBALS = re.compile(
    r"collections\.(OrderedDict|Counter)|builtins\.(set|bytearray|complex)|_codecs\.encode"
    r"|torch\.(Size|Tensor|device|nn\.parameter\.Parameter|serialization\._get_layout|_tensor\._rebuild_from_type_v2"
    r"|_utils\._rebuild_(tensor|tensor_v2|tensor_v3|parameter|parameter_with_state|qtensor|sparse_tensor"
    r"|meta_tensor_no_storage|nested_tensor|wrapper_subclass|device_tensor_from_numpy|device_tensor_from_cpu_tensor)"
    r"|storage\.(Typed|Untyped)Storage|[A-Z][A-Za-z0-9]*(Storage|Tensor)|per_(tensor|channel)_\w+"
    r"|(u?int|float|bfloat|complex|qu?int|float8_)[0-9a-z_]*|bool|half|double|long|short|cfloat|cdouble|chalf)")
# What a file may hold besides, by where it lies: DeepSpeed's own objects in its checkpoint (engine/; the ranks
# allow exactly these classes, autotune.runtime.engine), numpy's random state in an older autotune's rng files.
DEEPSPEED_GLOBALS = ("deepspeed.runtime.fp16.loss_scaler.LossScaler",
                     "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                     "deepspeed.runtime.zero.config.ZeroStageEnum", "deepspeed.utils.tensor_fragment.fragment_address")
OLDER_RNG_GLOBALS = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
                     "numpy.dtype")
MAX_PICKLE_BYTES = 256 << 20  # a pickle's part of a torch file (the tensors' bytes are stored beside it)


def _allowed(name: str, rel: str) -> bool:
    if SAFE_GLOBALS.fullmatch(name):
        return True
    if rel.startswith("engine/"):
        return name in DEEPSPEED_GLOBALS
    return rel.startswith(RNG_PREFIX) and name in OLDER_RNG_GLOBALS


def pickled_objects(data: bytes) -> set[str]:
    """The names of the functions and classes a pickle would call, read from its opcodes (never run). A name
    built at load time (STACK_GLOBAL from strings that are not plain, OBJ, the copyreg registry) is named by how."""
    import pickletools

    names: set[str] = set()
    strings: list[str] = []  # the plain strings just pushed: where a STACK_GLOBAL takes its module and name
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            names.add(str(arg).replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.add(".".join(strings[-2:]) if len(strings) >= 2 else "<a name built at load time>")
        elif op.name in ("OBJ", "EXT1", "EXT2", "EXT4"):
            names.add(f"<an object made by the {op.name} opcode>")
        if isinstance(arg, str) and ("UNICODE" in op.name or "STRING" in op.name):
            strings.append(arg)
        elif op.name not in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):
            strings.clear()
    return names


def foreign_objects(path: Path, rel: str) -> list[str]:
    """What in the torch file ``path`` (``rel`` inside its checkpoint) is not data a checkpoint may hold, by name.
    ValueError when it cannot be inspected: not in torch's zip format (damaged, or not torch's), no pickle in it,
    a pickle that does not read, or one over MAX_PICKLE_BYTES."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            pickles = [i for i in z.infolist() if i.filename.endswith(".pkl")]
            if not pickles:
                raise ValueError("no pickle in it")
            found: set[str] = set()
            for info in pickles:
                with z.open(info) as f:
                    data = f.read(MAX_PICKLE_BYTES + 1)
                if len(data) > MAX_PICKLE_BYTES:
                    raise ValueError(f"a pickle over {MAX_PICKLE_BYTES >> 20} MiB")
                found |= pickled_objects(data)
    except zipfile.BadZipFile:
        raise ValueError("not in torch's zip format") from None
    except (EOFError, OSError, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as e:
        raise ValueError(str(e)[:100] or type(e).__name__) from None
    return sorted(n for n in found if not _allowed(n, rel))


def refuse_untrusted(ckpt: Path) -> list[str]:
    """A checkpoint is data, and only what autotune wrote: a symbolic link or an entry that is neither a folder
    nor a regular file (a named pipe) is refused by name, and so is any torch file whose pickles would create
    anything but tensors and plain values: the function or class is named (``posix.system``) and nothing of the
    checkpoint is loaded. A DCP folder (fsdp/) is refused the same way where its metadata would build anything but
    DCP's own classes or send an entry to anything but a regular file in it, and where meta.json does not say FSDP2
    wrote the checkpoint. UserError (exit 2), before any rank starts. Returns the files that cannot be inspected
    (damage, which the checksums usually name first)."""
    import os
    import stat

    unreadable = []
    for root, dirs, files in os.walk(ckpt):
        for name in sorted(dirs + files):
            p = Path(root) / name
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                raise UserError(f"--resume_from: {p} is a symbolic link (to {os.readlink(p)}); a checkpoint holds "
                                "only its own files and autotune never follows a link in it: refused")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise UserError(f"--resume_from: {p} is not a regular file (a named pipe, socket or device); a "
                                "checkpoint holds only its own files: refused")
            rel = str(p.relative_to(ckpt))
            if stat.S_ISREG(mode) and name.endswith(".pt"):
                try:
                    foreign = foreign_objects(p, rel)
                except ValueError as e:
                    unreadable.append(f"{p}: not a file torch can read ({e}): damaged")
                    continue
                if foreign:
                    raise UserError(f"--resume_from: {p} holds {', '.join(foreign)}, which is not data: autotune "
                                    "loads only tensors and plain values from a checkpoint and never runs what one "
                                    "holds, so this checkpoint is refused (not written by autotune, or changed "
                                    "since); resume from another checkpoint")
    if (ckpt / SHARDED_DIR).is_dir():  # its pickle first: a payload is named whatever the meta says
        try:
            dcp_storage_files(ckpt / SHARDED_DIR)
        except ValueError as e:
            unreadable.append(f"{ckpt / SHARDED_DIR / DCP_METADATA}: not DCP's metadata ({e}): damaged")
        sharded_backend(ckpt)
    return unreadable


# ---- honest resume: what the checkpoint trained with vs what this plan says ----------------------
def resume_changes(meta: dict, plan) -> dict[str, tuple]:
    """Fields whose value differs between the checkpoint (meta['training']) and this plan.
    Empty for checkpoints written before fingerprints were recorded."""
    old = meta.get("training")
    if not isinstance(old, dict):
        return {}
    from autotune.plan import training_values

    new = training_values(plan)
    return {k: (old.get(k), v) for k, v in new.items() if k in old and old.get(k) != v}


def describe_changes(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())
