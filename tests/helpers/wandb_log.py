"""An offline W&B run's records, read from its transaction log without W&B's service."""

import json
import struct
from pathlib import Path

# The file is a 7-byte header (':W&B', magic 0xBEE1, version) followed by a LevelDB-style log: 32 KiB blocks of
# records, each a 7-byte header (crc32c, little-endian length, type) and data; records too big for a block are
# split FIRST/MIDDLE/LAST. Each full record is a protobuf `Record` from wandb.proto.

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind in (FIRST, MIDDLE):
            pending = chunk if kind == FIRST else pending + chunk
            continue
        pending = chunk if kind == FULL else pending + chunk
        rec = pb.Record()
        rec.ParseFromString(pending)
        yield rec


def history_and_summary(path: Path):
    """([{key: value} per logged row], {summary key: value}, run record) from the transaction log."""
    rows, summary, run = [], {}, None
    for rec in wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                summary[item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "run":
            run = rec.run
    return rows, summary, run
