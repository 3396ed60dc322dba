"""The metrics of an offline wandb run (WANDB_MODE=offline), read back from its ``run-<id>.wandb`` file.

wandb 0.31 writes the file from its Go core and ships no Python reader. The file is a LevelDB-style
record log (a 7-byte header ``:W&B`` + magic + version, then 32 KiB blocks of chunks with a 7-byte
header: CRC, length, type) of ``wandb_internal_pb2.Record`` protobufs; a history record is one
``wandb.log`` call."""

import json
import struct
from pathlib import Path

FILE_HEADER = b":W&B"
FILE_HEADER_BYTES = 7
BLOCK_BYTES = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")  # CRC-32C, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    """Every Record in an offline run file, in order (chunks joined; CRCs not checked)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[: len(FILE_HEADER)] == FILE_HEADER, f"{path} is not a wandb run file"
    pos, payload = FILE_HEADER_BYTES, b""
    while pos + CHUNK_HEADER.size <= len(data):
        left_in_block = BLOCK_BYTES - pos % BLOCK_BYTES
        if left_in_block < CHUNK_HEADER.size:  # the block's tail is padding
            pos += left_in_block
            continue
        _crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0:  # zero padding: the writer stopped here
            break
        chunk = data[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length]
        pos += CHUNK_HEADER.size + length
        payload = chunk if kind in (FULL, FIRST) else payload + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            yield record


def history(path: Path) -> dict[int, dict]:
    """{step: {metric: value}} from the run's history records (one per ``wandb.log``)."""
    out: dict[int, dict] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            step = out.setdefault(record.history.step.num, {})
            for item in record.history.item:
                step[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def run_files(wandb_dir: Path) -> list[Path]:
    """The offline runs' record files under WANDB_DIR, oldest first."""
    return sorted(Path(wandb_dir).glob("wandb/offline-run-*/run-*.wandb"))
