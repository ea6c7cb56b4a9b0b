"""Continuous batching of DEAR-regulated debates for the server: one thread owns the debater and the engine.

Requests wait in a bounded queue. Between two engine steps the scheduler admits waiting requests (up to
`max_active` debates in flight), and one `DebateEngine.advance` call runs round 0 of the newly admitted debates
together with the next exchange round of every debate already running: requests that overlap in time share
one batched backend call per round (llama.cpp slots, vLLM continuous batching, concurrent HTTP). When the
scheduler is idle, the first request waits `batch_window_s` for others to arrive with it.

Each job hears about its debate through `notify(event)`, called from the scheduler thread: a `RoundDone`
per finished round, then `DebateDone` (also for a debate that failed because the backend returned errors)
or `DebateFailed` (the debate could not run at all: backend unavailable, internal error, shutdown).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dear.debate.engine import Debate, default_debate_seed
from dear.debate.trace import AgentTurn
from dear.infer import InferenceResult, RegulatedDebater, inference_result
from dear.llm.base import BackendError
from dear.regulator import RegulatedProtocol, RegulatorRecord
from dear.tasks.types import Question

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """More requests are waiting than `max_queue` allows (HTTP 429)."""


class Unavailable(RuntimeError):
    """The backend cannot be used right now (HTTP 503); the message says why."""


@dataclass
class RoundDone:
    round: int
    turns: list[AgentTurn]
    control: RegulatorRecord | None  # the regulator's decision that drove this round (None for round 0)


@dataclass
class DebateDone:
    result: InferenceResult  # result.failed: the backend returned errors (the server answers 503)
    queued_s: float  # from submission to the debate's round 0
    debate_s: float  # from round 0 to the vote


@dataclass
class DebateFailed:
    reason: str
    status: int  # 503 backend unavailable / shutting down, 500 internal error


Event = RoundDone | DebateDone | DebateFailed


@dataclass(eq=False)
class DebateJob:
    """One request's debate: its question, its seed (None: derived from the question) and its listener."""

    question: Question
    seed: int | None
    notify: Callable[[Event], None]
    cancelled: bool = False  # set by the server when the client went away: the debate is dropped
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None


@dataclass
class _Running:
    debate: Debate
    job: DebateJob


@dataclass
class SchedulerStats:
    """What the scheduler did since start (GET /health shows it)."""

    steps: int = 0  # engine steps (one batched backend call per backend each)
    debate_rounds: int = 0  # summed over steps: debates advanced (mean batch = debate_rounds / steps)
    max_debates_per_step: int = 0
    debates_started: int = 0
    debates_finished: int = 0
    debates_failed: int = 0
    debates_cancelled: int = 0
    last_backend_error: str | None = None  # set when every request of the last step failed

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mean_debates_per_step"] = round(self.debate_rounds / self.steps, 2) if self.steps else 0.0
        return out


class DebateScheduler:
    """Runs every request's debate on one RegulatedDebater (built by `build`), batching concurrent ones."""

    def __init__(self, build: Callable[[], RegulatedDebater], *, max_active: int = 32, max_queue: int = 256,
                 batch_window_s: float = 0.01, retry_s: float = 5.0):
        if max_active < 1 or max_queue < 1:
            raise ValueError(f"max_active and max_queue must be >= 1, got {max_active}, {max_queue}")
        self._build = build
        self.max_active, self.max_queue = max_active, max_queue
        self.batch_window_s, self.retry_s = batch_window_s, retry_s
        self.debater: RegulatedDebater | None = None
        self.unavailable: str | None = "not connected yet"
        self._last_attempt = -float("inf")
        self._protocol: RegulatedProtocol | None = None
        self._queue: deque[DebateJob] = deque()
        self._active: list[_Running] = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.stats = SchedulerStats()

    # ------------------------------------------------------------ lifecycle
    def connect(self) -> bool:
        """Build the debater (loads the policy, the encoder and the backend). A BackendError (server down,
        no CUDA...) leaves the scheduler unavailable, to be retried later; any other error propagates."""
        self._last_attempt = time.monotonic()
        try:
            debater = self._build()
        except BackendError as e:
            self.unavailable = f"backend unavailable: {e}"
            log.warning("%s (retrying at the next request, at most every %.1f s)", self.unavailable, self.retry_s)
            return False
        self.debater, self._protocol, self.unavailable = debater, debater.protocol(), None
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="dear-scheduler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop after the current step; waiting and running debates get DebateFailed(503)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for job in [*self._queue, *(r.job for r in self._active)]:
            _tell(job, DebateFailed("server is shutting down", 503))
        self._queue.clear()
        self._active.clear()
        if self.debater is not None:
            self.debater.close()

    # ------------------------------------------------------------ requests
    @property
    def synthetic(self) -> bool:
        return bool(self.debater is not None and self.debater.backend.synthetic)

    def load(self) -> dict[str, int]:
        return {"queued": len(self._queue), "active": len(self._active), "max_active": self.max_active,
                "max_queue": self.max_queue}

    def submit(self, job: DebateJob) -> None:
        """Queue a debate; raises Unavailable (backend down, no retry due yet) or QueueFull."""
        with self._cv:
            if self._closed:
                raise Unavailable("server is shutting down")
            if self.debater is None and time.monotonic() - self._last_attempt < self.retry_s:
                raise Unavailable(self.unavailable or "backend unavailable")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are already waiting (max_queue={self.max_queue}); "
                                f"retry later")
            self._queue.append(job)
            self._cv.notify_all()

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or self._queue or self._active)
                if self._closed:
                    return
                if not self._active:  # idle: let requests that arrive together share round 0
                    self._cv.wait_for(lambda: self._closed or len(self._queue) >= self.max_active,
                                      timeout=self.batch_window_s)
                    if self._closed:
                        return
                admitted = self._admit()
            if self.debater is None and not self.connect():
                for job in admitted:
                    _tell(job, DebateFailed(self.unavailable or "backend unavailable", 503))
                continue
            try:
                self._step(admitted)
            except Exception as e:  # a bug or an encoder/policy failure: fail these debates, keep serving
                log.exception("scheduler step failed")
                for job in [*admitted, *(r.job for r in self._active)]:
                    _tell(job, DebateFailed(f"internal error: {type(e).__name__}: {e}", 500))
                self._active.clear()
                assert self._protocol is not None
                self._protocol.records.clear()

    def _admit(self) -> list[DebateJob]:
        jobs = []
        while self._queue and len(self._active) + len(jobs) < self.max_active:
            job = self._queue.popleft()
            if not job.cancelled:
                jobs.append(job)
        return jobs

    def _step(self, admitted: list[DebateJob]) -> None:
        assert self.debater is not None and self._protocol is not None
        engine, protocol = self.debater.engine, self._protocol
        for r in [r for r in self._active if r.job.cancelled]:
            self._active.remove(r)
            protocol.records.pop(r.debate.debate_id, None)
            self.stats.debates_cancelled += 1
        new = engine.create([j.question for j in admitted],
                            [default_debate_seed(j.question) if j.seed is None else j.seed for j in admitted],
                            protocol=protocol.name)
        now = time.perf_counter()
        for job in admitted:
            job.started = now
        running = [r.debate for r in self._active]
        controls = protocol.controls(running) if running else []
        engine.advance(new, running, controls)
        self._active += [_Running(d, j) for d, j in zip(new, admitted)]
        self._record_step(len(self._active))
        still = []
        for r in self._active:
            self._report(r)
            if not r.debate.done:
                still.append(r)
        self._active = still

    def _record_step(self, n_debates: int) -> None:
        s = self.stats
        s.steps += 1
        s.debate_rounds += n_debates
        s.max_debates_per_step = max(s.max_debates_per_step, n_debates)
        turns = [t for r in self._active for t in r.debate.last_turns]
        errors = [t.error for t in turns if t.error is not None]
        s.last_backend_error = errors[0] if turns and len(errors) == len(turns) else None

    def _report(self, r: _Running) -> None:
        d, job = r.debate, r.job
        assert self._protocol is not None
        records = self._protocol.records.get(d.debate_id, [])
        if d.round == 0:
            self.stats.debates_started += 1
        if not d.failed:
            control = records[-1] if d.round >= 1 and records else None
            _tell(job, RoundDone(d.round, d.last_turns, control))
        if d.done:
            self._protocol.records.pop(d.debate_id, None)
            self.stats.debates_finished += not d.failed
            self.stats.debates_failed += d.failed
            started = job.started or job.submitted
            _tell(job, DebateDone(inference_result(d, records), queued_s=started - job.submitted,
                                  debate_s=time.perf_counter() - started))


def _tell(job: DebateJob, event: Event) -> None:
    try:
        job.notify(event)
    except Exception:  # the listener's event loop is gone (server stopping): nothing left to tell
        log.debug("could not deliver %s", type(event).__name__, exc_info=True)
