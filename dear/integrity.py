"""Verified files: sha256 per file recorded at save time and checked at load, named read errors; the atomic
writes of `dear.atomic` re-exported for the callers that verify files.

Used by training checkpoints (`train/checkpoint.py`) and policy exports (`dear/export.py`). A checksum file is
JSON ``{"format": "dear-sha256", "files": {"name": "<sha256 hex>", ...}}`` next to the files it covers; a file
whose bytes no longer match raises `IntegrityError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dear.atomic import atomic_write_bytes, atomic_write_text, write_json  # noqa: F401  (re-exported)

CHECKSUM_FORMAT = "dear-sha256"
CHECKSUMS_FILE = "checksums.json"  # the checksum file of a training checkpoint directory


class IntegrityError(ValueError):
    """A file is missing, damaged (checksum mismatch) or cannot be parsed; the message names it."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_checksums(directory: str | Path, names: Iterable[str], checksum_file: str) -> dict[str, str]:
    """Record the sha256 of `names` (files in `directory`) in `directory/checksum_file`; returns the mapping."""
    directory = Path(directory)
    files = {name: sha256_file(directory / name) for name in sorted(names)}
    write_json(directory / checksum_file, {"format": CHECKSUM_FORMAT, "files": files}, indent=1,
               trailing_newline=True)
    return files


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """Parse a JSON file; an unreadable or truncated file raises IntegrityError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IntegrityError(f"{path}: {what} is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{path}: {what} cannot be parsed (damaged or truncated?): {e}") from None


def verify_checksums(directory: str | Path, checksum_file: str) -> dict[str, str] | None:
    """Check every file listed in `directory/checksum_file`. Returns the mapping, or None when the directory
    has no checksum file (written before checksums existed: unverified). Raises IntegrityError naming the
    first missing or damaged file."""
    directory = Path(directory)
    path = directory / checksum_file
    if not path.exists():
        return None
    doc = read_json(path, "checksum file")
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or doc.get("format") != CHECKSUM_FORMAT:
        raise IntegrityError(f"{path}: not a {CHECKSUM_FORMAT} checksum file")
    for name, expected in sorted(files.items()):
        target = directory / name
        if not target.is_file():
            raise IntegrityError(f"{target}: missing (listed in {path})")
        if sha256_file(target) != expected:
            raise IntegrityError(f"{target}: damaged: its sha256 does not match the one recorded at save time "
                                 f"in {path}")
    return files


def verify_checkpoint_checksums(directory: str | Path) -> bool:
    """Check a training checkpoint directory against its `CHECKSUMS_FILE`: True when verified, False (with a
    warning on stderr) when it was written before checksums existed. Raises IntegrityError naming a missing or
    damaged file. The trainer's resume and the policy export both verify through here."""
    directory = Path(directory)
    if verify_checksums(directory, CHECKSUMS_FILE) is not None:
        return True
    print(f"warning: {directory} has no {CHECKSUMS_FILE} (written before checksums): its files cannot be verified",
          file=sys.stderr)
    return False


def check_output_file(path: str | Path, flag: str = "--out") -> Path:
    """Fail before any work when `path` cannot become an output file: it is a directory, a parent is a file,
    or its directory is not writable. Creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file path (e.g. {path / 'traces.jsonl'})")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path}: exists and is not writable")
    return path
