"""A checkpoint is data, checked without torch before any rank starts: a link or an odd entry in it is refused by
name, and so is a torch file whose pickles would create anything but tensors and plain values (its opcodes read,
never unpickled), and an FSDP2 DCP folder whose metadata is not DCP's own (``rundir.sharded``)."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.errors import UserError
from autotune.rundir.layout import RNG_PREFIX
from autotune.rundir.sharded import DCP_METADATA, SHARDED_DIR, dcp_storage_files, sharded_backend

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
# allow exactly these classes, autotune.runtime.checkpoint_manager), numpy's random state in an older autotune's rng
# files.
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
