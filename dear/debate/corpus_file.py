"""The debate corpus file, `corpus.jsonl.gz`: concatenated gzip members, each one JSON line
`{"kind", "layout", "policy", "trace"}` with a full DebateTrace. Written by `python -m simworld.corpus`; read by
the simulator's fit and evidence match, the offline judge and `eval.regrade`."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from dear.debate.trace import DebateTrace

CORPUS_FILE = "corpus.jsonl.gz"


def gzip_members(data: bytes) -> tuple[list[bytes], int]:
    """Decompress concatenated gzip members; returns the complete members and the byte length they span."""
    out, pos = [], 0
    while pos < len(data):
        dec = zlib.decompressobj(wbits=31)
        try:
            body = dec.decompress(data[pos:]) + dec.flush()
        except zlib.error:
            break
        if not dec.eof:
            break
        out.append(body)
        pos = len(data) - len(dec.unused_data)
    return out, pos


def read_corpus(path: str | Path) -> list[dict]:
    """All records of a corpus directory (or its corpus.jsonl.gz), in the order they were written."""
    path = Path(path)
    if path.is_dir():
        path = path / CORPUS_FILE
    if not path.exists():
        raise ValueError(f"corpus file not found: {path}")
    members, _ = gzip_members(path.read_bytes())
    out = []
    for body in members:
        out.extend(json.loads(line) for line in body.decode("utf-8").splitlines() if line.strip())
    return out


def iter_traces(records: Sequence[dict], kind: str | None = None) -> Iterator[DebateTrace]:
    """The DebateTrace of every record (of one kind, `logging` or `mad`, if given)."""
    for r in records:
        if kind is None or r["kind"] == kind:
            yield DebateTrace.from_dict(r["trace"])
