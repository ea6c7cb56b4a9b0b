"""One backend call for several debate engines that advance at the same time.

Each served method has its own `DebateEngine` (a one-agent chain of thought cannot share an engine with a
three-agent debate), and an engine makes its own `generate` call per step. `SharedBatch` wraps the backend
they all use: `run_together` runs one engine step per thread, and the generate calls those threads make are
answered together by one call of the wrapped backend, made once every thread is either waiting in `generate`
or done. Outside `run_together` it passes calls straight through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dear.llm.base import Backend, BackendError, ChatRequest, Completion
from dear.llm.wrapper import BackendWrapper


@dataclass(eq=False)
class _Call:
    requests: list[ChatRequest]
    completions: list[Completion] = field(default_factory=list)
    error: BaseException | None = None
    done: bool = False


class SharedBatch(BackendWrapper):
    """A backend shared by engines that step together (see the module docstring). Identity, token counts and
    `serves` are the wrapped backend's (`BackendWrapper`); `close` leaves the wrapped backend open."""

    def __init__(self, inner: Backend):
        super().__init__(inner)
        self._cv = threading.Condition()
        self._gathering = False
        self._running = 0  # threads of the current `run_together` neither waiting in generate nor done
        self._waiting: list[_Call] = []
        self._pool: ThreadPoolExecutor | None = None
        self._workers = 0
        self.calls = 0  # generate calls made to the wrapped backend

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        with self._cv:
            gathering = self._gathering
        if not gathering:
            self.calls += 1
            return self.inner.generate(requests)
        call = _Call(list(requests))
        with self._cv:
            self._waiting.append(call)
            self._running -= 1
            self._cv.notify_all()
            self._cv.wait_for(lambda: call.done)
        if call.error is not None:
            raise call.error
        return call.completions

    def run_together(self, steps: Sequence[Callable[[], None]]) -> None:
        """Run every step at once, one thread each, answering their generate calls with one backend call per
        wave; re-raises the first exception a step raised (after all of them ended)."""
        if len(steps) <= 1:
            for step in steps:
                step()
            return
        if self._workers < len(steps):  # one thread per engine, kept between steps
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(max_workers=len(steps), thread_name_prefix="dear-engine")
            self._workers = len(steps)
        with self._cv:
            self._gathering, self._running, self._waiting = True, len(steps), []
        try:
            futures = [self._pool.submit(self._run_one, step) for step in steps]  # type: ignore[union-attr]
            self._answer_waves()
        finally:
            with self._cv:
                self._gathering = False
        for f in futures:
            f.result()  # raises the step's exception

    def _run_one(self, step: Callable[[], None]) -> None:
        try:
            step()
        finally:
            with self._cv:
                self._running -= 1
                self._cv.notify_all()

    def _answer_waves(self) -> None:
        """Until every step is done: wait until no step is running, then answer all waiting calls at once."""
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._running == 0)
                calls, self._waiting = self._waiting, []
            if not calls:
                return
            self._answer(calls)
            with self._cv:
                self._running += len(calls)  # before they wake, so the next wave waits for them
                for c in calls:
                    c.done = True
                self._cv.notify_all()

    def _answer(self, calls: list[_Call]) -> None:
        requests = [r for c in calls for r in c.requests]
        self.calls += 1
        try:
            completions = self.inner.generate(requests)
            if len(completions) != len(requests):
                raise BackendError(f"backend returned {len(completions)} completions for {len(requests)} requests")
        except Exception as e:  # every engine turns it into failed turns, as it would its own call's
            for c in calls:
                c.error = e
            return
        start = 0
        for c in calls:
            c.completions = completions[start:start + len(c.requests)]
            start += len(c.requests)

    def close(self) -> None:
        """Stops the worker threads; the wrapped backend belongs to whoever built it."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool, self._workers = None, 0
