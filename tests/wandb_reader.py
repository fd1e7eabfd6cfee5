"""Read an offline W&B run (`run-<id>.wandb`) back: history rows, summary and config.

wandb no longer ships a reader. The file is a LevelDB-style log: a 7-byte header (`:W&B` + version),
then 32 KiB blocks of records, each with a 7-byte header (crc32: 4, length: 2, type: 1; types FULL=1,
FIRST=2, MIDDLE=3, LAST=4) carrying serialized `wandb_internal_pb2.Record` messages.
"""

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024


def read_records(path: Path) -> list:
    data = Path(path).read_bytes()
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        block_left = BLOCK - (pos % BLOCK)
        if block_left < 7:  # block trailer padding
            pos += block_left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wait_for_exit(path: Path, timeout: float = 120.0) -> None:
    """Waits until the run file holds its `exit` record. wandb's service process writes the file and may still
    be flushing the last rows after the training process has exited (seen on a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout
    while not any(r.WhichOneof("record_type") == "exit" for r in read_records(path)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} has no exit record after {timeout} s")
        time.sleep(0.5)


def read_run(run_dir: Path, finished: bool = False) -> dict:
    """{'history': [dict], 'summary': dict, 'config': dict} of the offline run in `run_dir`; `finished`: the run
    ended in another process, so wait for its exit record (an in-process run has none until it finishes)."""
    (path,) = Path(run_dir).glob("run-*.wandb")
    if finished:
        wait_for_exit(path)
    history, summary, config = [], {}, {}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif kind == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return {"history": history, "summary": summary, "config": config}
