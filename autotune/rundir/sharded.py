"""FSDP2's DCP folder in a checkpoint (fsdp/) as data, without torch: the launcher checks it before any rank
starts and the ranks check it again before DCP reads it (``autotune.runtime.fsdp_checkpoint``). DCP's ``.metadata`` is a
pickle; here it is read by an unpickler that builds stand-ins of DCP's own classes only (``DCP_GLOBALS``; the ranks
build the real classes from the same list), so a payload is named and never runs. Each entry's file (DCP's
``relative_path``, which DCP joins to the folder and opens) must be a plain name of a regular file in the folder:
never a path out of the checkpoint, a link or a named pipe. Only a checkpoint whose meta.json says FSDP2 wrote it
is read through DCP."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.errors import UserError

SHARDED_DIR = "fsdp"  # the DCP folder inside a checkpoint (autotune.runtime.fsdp_checkpoint writes it)
DCP_METADATA = ".metadata"
# What DCP's .metadata may build (torch 2.x): DCP's own metadata classes, torch sizes, dtypes and layouts, paths.
DCP_GLOBALS = frozenset({f"torch.distributed.checkpoint.metadata.{name}" for name in (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")} | {
    "torch.distributed.checkpoint.filesystem._StorageInfo", "torch.Size", "torch.serialization._get_layout",
    "pathlib.PosixPath", "pathlib.PurePosixPath", "collections.OrderedDict"})
TORCH_DTYPE = re.compile(r"torch\.((u?int|float|bfloat|complex|qu?int|float8_)[0-9a-z_]*|bool|half|double|long|short"
                         r"|cfloat|cdouble|chalf)")
MAX_METADATA_BYTES = 256 << 20


def dcp_global_allowed(module: str, name: str) -> bool:
    return f"{module}.{name}" in DCP_GLOBALS or bool(TORCH_DTYPE.fullmatch(f"{module}.{name}"))


def not_data(metadata_file: Path, name: str) -> UserError:
    return UserError(f"--resume_from: {metadata_file} holds {name}, which is not data: autotune reads only DCP's own "
                     "metadata classes from it and ran none of it; resume from another checkpoint")


def storage_file_problem(shard_dir: Path, relative_path) -> str | None:
    """Why a DCP entry's ``relative_path`` is not a file of ``shard_dir`` autotune reads (None: it is): a plain
    name (no folder, no '..', no link) of a regular file, never opened here (a named pipe would block)."""
    import os
    import stat

    shown = repr(relative_path)[:200]  # a name from outside, printed escaped and bounded
    if not isinstance(relative_path, str) or not relative_path or "/" in relative_path or "\\" in relative_path \
            or "\0" in relative_path or relative_path in (".", ".."):
        return (f"{shard_dir / DCP_METADATA} sends its data to {shown}: not a plain file name in "
                f"{shard_dir}; a checkpoint's data lies in its own folder, refused")
    try:
        mode = os.lstat(shard_dir / relative_path).st_mode
    except OSError:
        return f"{shard_dir / DCP_METADATA} sends its data to {shown}: no such file in {shard_dir}"
    if not stat.S_ISREG(mode):
        return (f"{shard_dir / DCP_METADATA} sends its data to {shown}: not a regular file (a link, pipe "
                "or folder); refused")
    return None


def check_storage_paths(shard_dir: Path, relative_paths: list) -> None:
    """UserError (exit 2) naming the first ``relative_path`` that is not a regular file of ``shard_dir``."""
    seen: set[str] = set()
    for rel in relative_paths:
        if isinstance(rel, str) and rel in seen:
            continue
        problem = storage_file_problem(shard_dir, rel)
        if problem:
            raise UserError(f"--resume_from: {problem}")
        seen.add(rel)


class _StandIn:
    """What DCP's classes become in the launcher (no torch here): their arguments and state, nothing run. Each
    class made for a name keeps its instances in ``made``."""

    made: list

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args, obj.state = args, None
        cls.made.append(obj)
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.state = state


def dcp_storage_files(shard_dir: Path) -> list:
    """The files DCP's metadata in ``shard_dir`` sends its entries to, each checked (``check_storage_paths``). Its
    pickle is read by an unpickler that builds stand-ins of the allowed classes only (``DCP_GLOBALS``): anything
    else is refused by name (UserError, exit 2) and nothing of it runs. ValueError for a metadata file that does not
    read (missing, damaged, over MAX_METADATA_BYTES)."""
    import io
    import pickle

    metadata_file = shard_dir / DCP_METADATA
    made: dict[str, type] = {}

    class StandIns(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            full = f"{module}.{name}"
            if not dcp_global_allowed(module, name):
                raise not_data(metadata_file, full)
            if full not in made:
                made[full] = type(name, (_StandIn,), {"made": []})
            return made[full]

        def persistent_load(self, pid):
            raise pickle.UnpicklingError("a persistent id")

    try:
        with open(metadata_file, "rb") as f:
            data = f.read(MAX_METADATA_BYTES + 1)
        if len(data) > MAX_METADATA_BYTES:
            raise ValueError(f"over {MAX_METADATA_BYTES >> 20} MiB")
        StandIns(io.BytesIO(data)).load()
    except UserError:
        raise
    except FileNotFoundError:
        raise ValueError("missing") from None
    except Exception as e:  # any other failure of a pickle of stand-ins is damage
        raise ValueError(str(e)[:100] or type(e).__name__) from None
    paths = []  # every entry's file: what a _StorageInfo was given, and a relative_path set on any object
    for full, cls in made.items():
        for obj in cls.made:
            state = obj.state if isinstance(obj.state, dict) else {}
            if isinstance(obj.state, tuple) and len(obj.state) == 2:  # (state, slot state): pickle sets both
                state = {**(obj.state[0] or {}), **(obj.state[1] or {})} if all(
                    isinstance(part, dict) or part is None for part in obj.state) else {"relative_path": None}
            if "relative_path" in state:
                paths.append(state["relative_path"])
            elif full.endswith("._StorageInfo"):
                paths.append(obj.args[0] if obj.args else None)
    check_storage_paths(shard_dir, paths)
    return paths


def sharded_backend(ckpt: Path) -> bool:
    """Whether resuming from ``ckpt`` reads its fsdp/ folder: only when its meta says FSDP2 wrote it. A DCP folder
    in a checkpoint another backend wrote was not written by autotune: UserError (exit 2), never read."""
    if not (ckpt / SHARDED_DIR).is_dir():
        return False
    from autotune.rundir.layout import CHECKPOINT_META
    from autotune.safe_input import load_json, read_text

    try:
        meta = load_json(read_text(ckpt / CHECKPOINT_META, "--resume_from", follow_links=False), str(ckpt))
        backend = meta.get("backend") if isinstance(meta, dict) else None
    except UserError:
        backend = None
    if backend != "fsdp":
        raise UserError(f"--resume_from: {ckpt / SHARDED_DIR} holds FSDP2's sharded state, but meta.json says the "
                        f"{backend} backend wrote this checkpoint; autotune does not read a folder it did not write: "
                        "remove it or resume from another checkpoint")
    return True
