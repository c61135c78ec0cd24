"""What a torch.distributed.checkpoint (DCP) checkpoint may make torch run or read, in one place: checked before
anything of it is loaded (`problem`: FSDPStrategy.verify, called by ringexp.checkpoint.damage beside its own checks
of the files), and held to while it loads (`load`: FSDPStrategy.load).

torch's own reader unpickles `.metadata` with plain pickle.load and its own planner unpickles a non-tensor item with
weights_only=False: a checkpoint from someone else could run any code on resume. Here `.metadata` is read by a
restricted unpickler (METADATA_CLASSES), every file it refers to must be a plain file of the checkpoint, and every
non-tensor item must load as plain values (torch.load with weights_only=True).

torch.distributed.checkpoint is imported on first use, for the reason parallel/fsdp.py gives.
"""

import functools
import io
import pickle
from pathlib import Path

import torch

from ringexp import records
from ringexp.errors import CheckpointError, one_line

# What a DCP `.metadata` file holds: torch.distributed.checkpoint's own classes, torch's sizes, dtypes and layouts,
# and the path type (found by unpickling real checkpoints of this torch). Nothing here runs code when built.
METADATA_CLASSES = {("torch.distributed.checkpoint.metadata", n) for n in (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict")}


def problem(path) -> str | None:
    """What DCP would run or read that it must not, before it reads anything, as 'file: why', or None: `.metadata`
    holding anything but DCP's own classes, a file it refers to that is not one of this checkpoint's, a stream
    transform (ringexp writes none: a decompressor could be made to exhaust memory), a non-tensor item that is not
    plain values."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    try:
        metadata = read_metadata(Path(path) / ".metadata")
    except CheckpointError as e:
        return str(e).removeprefix(f"{Path(path)}/")
    names = {p.name for p in Path(path).iterdir()}
    for index, info in (metadata.storage_data or {}).items():
        where = getattr(index, "fqn", index)
        if not isinstance(info, _StorageInfo) or info.relative_path not in names or info.transform_descriptors:
            return (f".metadata: item {where!r} is stored as {getattr(info, 'relative_path', info)!r}"
                    f"{' with transforms' if getattr(info, 'transform_descriptors', None) else ''}: not a plain "
                    "file of this checkpoint")
        if type(info.offset) is not int or type(info.length) is not int or min(info.offset, info.length) < 0:
            return f".metadata: item {where!r} has offset {info.offset!r}, length {info.length!r}"
    return plain_items(Path(path), metadata)


def plain_items(path: Path, metadata) -> str | None:
    """A non-tensor item (an optimizer's learning rate, its betas) that holds more than plain values, as 'file:
    why', or None: DCP's own planner unpickles them with weights_only=False."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, BytesStorageMetadata):
            continue
        info = metadata.storage_data.get(MetadataIndex(fqn))
        if info is None:
            return f".metadata: item {fqn!r} is stored nowhere"
        with records.open_regular(path / info.relative_path) as f:
            f.seek(info.offset)
            data = f.read(info.length)
        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except Exception as e:
            return f"{info.relative_path}: item {fqn!r} cannot be loaded as plain values ({one_line(str(e))[:200]})"
    return None


def load(state: dict, path) -> None:
    """dcp.load of `state` from `path`, held to what `problem` checked: `.metadata` read by the restricted
    unpickler, tensors by torch with weights_only=True, other items as plain values."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader, planner = _loaders()
    try:
        dcp.load(state, storage_reader=reader(path), planner=planner())
    except CheckpointException as e:  # (a BaseException: it would pass through `except Exception`)
        raise CheckpointError(f"resume: {path}: the shards cannot be loaded ({one_line(str(e))}); resume from "
                              "another checkpoint (resume=PATH)") from None


def read_metadata(path: Path, load_id=None):
    """A DCP checkpoint's `.metadata` at `path`, read by the restricted unpickler (torch's own reader uses plain
    pickle.load, so a checkpoint from someone else could run any code on resume)."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    try:
        with records.open_regular(path) as f:
            metadata = _MetadataUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, RecursionError) as e:
        why = e if isinstance(e, pickle.UnpicklingError) else f"unreadable ({type(e).__name__}: {e})"
        raise CheckpointError(f"{path}: {why}") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CheckpointError(f"{path}: not a checkpoint's metadata (it holds {type(metadata).__name__})")
    if getattr(metadata, "storage_meta", None) is None:  # as torch's read_metadata does
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = load_id
    return metadata


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in METADATA_CLASSES or module == "torch" and isinstance(getattr(torch, name, None),
                                                                                  torch.dtype):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load: it asks for {module}.{name}, which a checkpoint's metadata "
                                     "never holds (it could run code); this checkpoint is not one ringexp wrote")


@functools.cache
def _loaders() -> tuple:
    """(reader class, planner class): DCP's file reader, reading `.metadata` with read_metadata, and its load
    planner, unpickling a non-tensor item with weights_only=True (torch's own uses weights_only=False: a planted
    byte item would run code on resume). Built on first use, as DCP is imported."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            return read_metadata(self._get_metadata_path(kwargs.get("rank")), self.load_id)

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeReader, SafePlanner
