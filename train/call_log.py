"""The model calls of a rollout chunk that has not finished, logged as they return and replayed by `--resume`.

A chunk's debates run in lockstep and finish together, minutes after they start on a CPU model, so the unit that
finishes first is a model call. While a chunk runs, the rollout worker's `CallLog` appends every successful
completion to the chunk's log (RUN_DIR/partial/iter_XXXXXX/chunk_YYYY.calls.jsonl: a header line with the rollout
key, then one JSON line per completion, flushed at once). `--resume` collects the chunk again from its seeds and
answers each request the log holds from the log instead of the model: the same weights and seeds make the same
requests, so every debate that had finished, and every call of those that had not, costs nothing the second time,
and the chunk ends exactly as it would have (bit for bit on the sim backend). Identical requests are told apart by
their occurrence number within the chunk, as in the response cache (dear/llm/cache.py). train/partial.py keeps
the finished chunks and removes a chunk's log once the chunk itself is kept.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dear.llm.base import Backend, ChatRequest, Completion
from dear.llm.cache import occurrence_keys
from dear.llm.wrapper import BackendWrapper


@dataclass(frozen=True)
class CallLogSpec:
    """Where the rollout workers log the calls of the chunks they run: the iteration's partial directory (absolute),
    the rollout key, and the host it is on (a worker on another host logs nothing: it cannot reach the path)."""

    directory: str
    key: str
    host: str

    def file(self, index: int) -> Path:
        return Path(self.directory) / f"chunk_{index:04d}.calls.jsonl"


def read_call_log(path: Path, key: str) -> dict[str, list[Completion]]:
    """The completions a call log holds by request key, in the order they were logged; {} when the file is absent
    or was written under another rollout key. A torn last line (a stop in the middle of a write) is dropped."""
    if not path.exists():
        return {}
    found: dict[str, list[Completion]] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for lineno, line in enumerate(lines):
        try:
            row = json.loads(line)
            if lineno == 0:
                if row.get("rollout_key") != key:
                    return {}
                continue
            found.setdefault(row["request"], []).append(Completion(**row["completion"]))
        except (ValueError, KeyError, TypeError) as e:
            if lineno == 0:
                return {}
            if lineno < len(lines) - 1:
                print(f"warning: {path}:{lineno + 1}: unreadable logged call ({type(e).__name__}); it is "
                      f"generated again", file=sys.stderr)
    return found


class CallLog(BackendWrapper):
    """Wraps a rollout worker's backend. Between `begin(spec, index)` and `end()` (one chunk), every request is
    answered from the chunk's call log when the log holds it and otherwise by the wrapped backend, whose
    successful completions are appended to the log at once. Outside a chunk it only passes requests through; the
    rest (identity, token counts, `serves`) is the wrapped backend's (`BackendWrapper`)."""

    def __init__(self, inner: Backend):
        super().__init__(inner)
        self._lock = threading.Lock()
        self._file = None
        self._logged: dict[str, list[Completion]] = {}
        self._seen: dict[str, int] = {}
        self.replayed = 0  # calls answered from a log (over the object's life)

    def begin(self, spec: CallLogSpec | None, index: int) -> None:
        self.end()
        if spec is None or spec.host != os.uname().nodename:
            return
        path = spec.file(index)
        self._logged = read_call_log(path, spec.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Rewrite the log with what it holds, so that calls made now append after a consistent file.
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps({"rollout_key": spec.key}) + "\n")
            for request_key, completions in self._logged.items():
                for c in completions:
                    f.write(_log_line(request_key, c))
        os.replace(tmp, path)
        self._file = path.open("a", encoding="utf-8")
        self._seen = {}

    def end(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._file, self._logged, self._seen = None, {}, {}

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        with self._lock:
            if self._file is None:
                return self.inner.generate(requests)
            keys = occurrence_keys(self.model_id, requests, self._seen)  # numbered across the chunk
            results: list[Completion | None] = []
            for key in keys:
                logged = self._logged.get(key)
                results.append(logged.pop(0) if logged else None)
        self.replayed += sum(c is not None for c in results)
        fresh = self.fill_missing(requests, results)
        if fresh:
            lines = [_log_line(keys[i], completion) for i, completion in fresh if completion.ok]
            with self._lock:
                if self._file is not None and lines:
                    self._file.write("".join(lines))
                    self._file.flush()
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Ends the chunk's log and closes the wrapped backend."""
        self.end()
        super().close()


def _log_line(request_key: str, completion: Completion) -> str:
    return json.dumps({"request": request_key, "completion": asdict(completion)}, ensure_ascii=False) + "\n"
