"""Atomic file writes: a reader, or a run resumed after a crash, sees the old file or the new one, never a torn one.

The data goes to a temporary file in the target's directory (same file system, so the rename is atomic), is
flushed to disk, then renamed over the target. A write that fails removes its temporary file and leaves the old
file as it was. Every run, summary, timing and settings JSON file the project writes goes through `write_json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def temporary_path(path: Path) -> Path:
    """The temporary file a write of `path` goes through; one per process, so two processes writing the same
    file never interleave into one temporary file."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, fsync, then rename: readers see the old or the new file."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of `text` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, *, trailing_newline: bool = False, **json_kwargs: Any) -> None:
    """Write `obj` atomically as the UTF-8 bytes of `json.dumps(obj, **json_kwargs)` (indent, sort_keys, default,
    ensure_ascii, ...), plus a final newline if `trailing_newline`. An object that cannot be serialised raises
    before anything is written."""
    text = json.dumps(obj, **json_kwargs)
    atomic_write_text(path, text + "\n" if trailing_newline else text)
