"""Persistent response cache (SQLite, WAL mode: several processes may share one file).

The key is a sha256 over (model id, messages, temperature, top_p, max_tokens, seed, stop) plus the
request's occurrence number among identical requests in the same batch: three agents sent the same
prompt without a seed get three different cached answers, as they did on the first run.
Only successful completions are stored; request metadata never enters the key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from dear.llm.base import Backend, BackendError, ChatRequest, Completion
from dear.llm.wrapper import BackendWrapper

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS completions (
    key TEXT PRIMARY KEY,
    model_id TEXT NOT NULL,
    completion TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(model_id: str, request: ChatRequest, occurrence: int = 0) -> str:
    payload = {
        "model_id": model_id,
        "messages": [[m.role, m.content] for m in request.messages],
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_tokens": request.max_tokens,
        "seed": request.seed,
        "stop": list(request.stop),
        "occurrence": occurrence,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def occurrence_keys(model_id: str, requests: Sequence[ChatRequest], seen: dict[str, int] | None = None) -> list[str]:
    """The `cache_key` of each request, numbering identical requests by occurrence. `seen` counts the occurrences
    so far (updated in place, so a caller that keeps it numbers across calls); None counts within this batch."""
    seen = {} if seen is None else seen
    keys = []
    for request in requests:
        base = cache_key(model_id, request)
        occurrence = seen.get(base, 0)
        seen[base] = occurrence + 1
        keys.append(cache_key(model_id, request, occurrence) if occurrence else base)
    return keys


def prime(path: str | os.PathLike, entries: Sequence[tuple[str, ChatRequest, Completion]]) -> int:
    """Store (model id, request, completion) entries in the cache file at `path` under the keys `CachedBackend`
    looks them up by, so a later run replays them instead of generating; existing entries are kept. Returns the
    number of entries added."""
    rows = [(cache_key(model_id, req), model_id, json.dumps(asdict(comp), ensure_ascii=False), time.time())
            for model_id, req, comp in entries]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), timeout=60, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(_SCHEMA)
        db.execute("BEGIN IMMEDIATE")
        before = db.total_changes
        db.executemany("INSERT OR IGNORE INTO completions VALUES (?, ?, ?, ?)", rows)
        db.execute("COMMIT")
        return db.total_changes - before
    finally:
        db.close()


class CachedBackend(BackendWrapper):
    """Wraps a backend; answers repeated requests from disk and sends only the misses, in one batch call. The rest
    (identity, token counts, `serves`) is the wrapped backend's (`BackendWrapper`).

    `enabled=False` passes everything through (training rollouts want fresh samples) while keeping the
    same object shape. Counters `hits` and `misses` accumulate over the object's life.
    """

    def __init__(self, inner: Backend, path: str | os.PathLike, enabled: bool = True):
        super().__init__(inner)
        self.path = Path(path)
        self.enabled = enabled
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if enabled:
            if self.path.is_dir():
                raise BackendError(f"response cache {self.path}: is a directory; give a file path "
                                   f"(e.g. {self.path / 'responses.sqlite'})")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._open()

    def _open(self, timeout_s: float = 60.0) -> sqlite3.Connection:
        """Connect, switch to WAL and create the table. Processes opening a new file together can see "database
        is locked" from the journal-mode switch, which SQLite's busy timeout does not cover: retry that."""
        deadline = time.monotonic() + timeout_s
        while True:
            db = None
            try:
                # timeout: wait for another process's write lock instead of failing with "database is locked"
                db = sqlite3.connect(self.path, timeout=timeout_s, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(_SCHEMA)
                db.execute("SELECT count(*) FROM completions").fetchone()
                return db
            except sqlite3.OperationalError as e:
                if db is not None:
                    db.close()
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise BackendError(self._unusable(e)) from None
                time.sleep(0.05)
            except sqlite3.DatabaseError as e:
                if db is not None:
                    db.close()
                raise BackendError(self._unusable(e)) from None

    def _unusable(self, e: Exception) -> str:
        return (f"response cache {self.path}: cannot be used as an SQLite cache ({e}); it is damaged or not a "
                f"cache: move it away or choose another cache path")

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        if not self.enabled or self._db is None:
            return self.inner.generate(requests)
        keys = occurrence_keys(self.model_id, requests)
        results: list[Completion | None] = [None] * len(requests)
        with self._lock:
            for i, key in enumerate(keys):
                try:
                    row = self._db.execute("SELECT completion FROM completions WHERE key = ?", (key,)).fetchone()
                except sqlite3.DatabaseError as e:
                    raise BackendError(f"response cache {self.path}: damaged ({e}); move it away or choose "
                                       f"another cache path") from None
                if row is not None:
                    try:
                        fields = json.loads(row[0])
                        fields["cached"] = True
                        results[i] = Completion(**fields)
                    except (ValueError, TypeError) as e:  # one damaged entry: ask the model again
                        log.warning("response cache %s: entry %s cannot be parsed (%s); regenerating it",
                                    self.path, key[:12], e)
        hits = sum(c is not None for c in results)
        self.hits += hits
        self.misses += len(requests) - hits
        fresh = self.fill_missing(requests, results)
        if fresh:
            rows = []
            for i, completion in fresh:
                if completion.ok:
                    stored = asdict(completion)
                    stored["cached"] = False
                    rows.append((keys[i], self.model_id, json.dumps(stored, ensure_ascii=False), time.time()))
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany("INSERT OR REPLACE INTO completions VALUES (?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")
        log.debug(
            "response cache %s: %d hits, %d misses in this batch (totals %d/%d)",
            self.path.name,
            hits,
            len(fresh),
            self.hits,
            self.misses,
        )
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Closes the database and the wrapped backend (the cache owns it)."""
        if self.enabled:
            log.info("response cache %s: %d hits, %d misses", self.path, self.hits, self.misses)
        if self._db is not None:
            self._db.close()
            self._db = None
        super().close()
