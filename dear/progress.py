"""A progress display that keeps moving while work is in flight: done/total, tokens, tokens/s, elapsed and ETA.

A long job on a CPU model finishes its first unit (a debate, a chunk of debates) only after minutes, so a bar
that redraws only when a unit ends looks dead. `LiveProgress` redraws from a ticker thread every `refresh_s`
seconds, reading a token counter (e.g. `dear.llm.base.GENERATED_TOKENS.total`, which backends advance as tokens
come back), so elapsed time and tokens/s move from the first seconds. On a terminal it is a tqdm bar; otherwise
(a log file, CI) it writes the same text as one plain line every `line_every_s` seconds instead of a flood.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from tqdm.auto import tqdm

REFRESH_S = 2.0  # terminal redraw interval
LINE_EVERY_S = 30.0  # plain-line interval when the output is not a terminal


@dataclass(frozen=True)
class ProgressSnapshot:
    """What the display shows at one tick."""

    done: int
    total: int
    tokens: int  # generated since the display started
    elapsed_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


class LiveProgress:
    """`total` units of work (`unit`: "debate", "q", ...), of which `initial` were done before this process.

    `tokens` returns a running count of generated tokens (any baseline: the display shows the increase since it
    started); None leaves tokens out. `listener` is called with a `ProgressSnapshot` at every tick, also when the
    display is disabled. Use as a context manager or call `close()`.
    """

    def __init__(self, total: int, desc: str, unit: str = "debate", initial: int = 0,
                 tokens: Callable[[], int] | None = None, enabled: bool = True,
                 listener: Callable[[ProgressSnapshot], None] | None = None, refresh_s: float | None = None,
                 line_every_s: float | None = None, file: TextIO | None = None, tty: bool | None = None):
        if total < 0 or initial < 0:
            raise ValueError(f"total and initial must be >= 0, got total={total}, initial={initial}")
        self._file = file or sys.stderr
        self._tty = _is_tty(self._file) if tty is None else tty
        self._tokens = tokens
        self._tokens0 = _safe_read(tokens) or 0
        self._last_tokens = 0
        self._listener = listener
        self._enabled = enabled
        self._done, self._total = initial, total  # kept here too: a disabled tqdm bar keeps no counts
        self._info: dict[str, str] = {}
        self._lock = threading.Lock()
        self._sink = None if self._tty else open(os.devnull, "w")  # non-terminal: the bar only formats the line
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self._file if self._tty else
                        self._sink, disable=not enabled, dynamic_ncols=self._tty, smoothing=0, mininterval=0.5)
        self._refresh_s = REFRESH_S if refresh_s is None else refresh_s
        self._line_every_s = LINE_EVERY_S if line_every_s is None else line_every_s
        self._t0 = time.monotonic()
        self._last_line = -math.inf  # the first tick writes a line at once
        self._last_text = ""
        self._stop = threading.Event()
        self._ticker = None
        if enabled or listener is not None:
            self._ticker = threading.Thread(target=self._tick_loop, name="progress-ticker", daemon=True)
            self._ticker.start()

    # -- what the caller reports --------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        """`n` more units done."""
        with self._lock:
            self._done += n
            if self._enabled:
                self.bar.update(n)

    def skip(self, n: int) -> None:
        """`n` units that count as done but took no time here (kept from an interrupted run): shown as done,
        left out of the rate and the ETA."""
        with self._lock:
            self._done += n
            if self._enabled:
                self.bar.initial += n
                self.bar.n += n

    def set_description(self, desc: str) -> None:
        with self._lock:
            self.bar.set_description_str(desc, refresh=False)

    def set_info(self, **fields: object) -> None:
        """Extra `name=value` fields shown after the tokens (kept until replaced)."""
        with self._lock:
            self._info.update({k: str(v) for k, v in fields.items()})

    def write(self, msg: str, file: TextIO | None = None) -> None:
        """A message line (to stdout unless `file`) printed above the bar instead of through it."""
        out = file or sys.stdout
        tqdm.write(msg, file=out)
        out.flush()

    # -- display --------------------------------------------------------------------------------------
    @property
    def done(self) -> int:
        return self._done

    def snapshot(self) -> ProgressSnapshot:
        read = _safe_read(self._tokens)  # outside the lock: a remote counter may take a moment to answer
        with self._lock:
            return self._snapshot(read)

    def _snapshot(self, read: int | None) -> ProgressSnapshot:
        if read is not None:
            self._last_tokens = max(0, read - self._tokens0)
        return ProgressSnapshot(done=self._done, total=self._total, tokens=self._last_tokens,
                                elapsed_s=time.monotonic() - self._t0)

    def _set_postfix(self, snap: ProgressSnapshot) -> None:
        fields = {}
        if self._tokens is not None:
            fields = {"tok": f"{snap.tokens:,}", "tok/s": f"{snap.tokens_per_s:.1f}"}
        self.bar.set_postfix({**fields, **self._info}, refresh=False)

    def tick(self, line: bool = False) -> None:
        """Redraw now (the ticker thread calls this); a non-terminal display writes a line every `line_every_s`
        seconds, or now with `line` (e.g. after an iteration's metrics)."""
        read = _safe_read(self._tokens)
        with self._lock:
            snap = self._snapshot(read)
            if self._enabled:
                self._set_postfix(snap)
                if self._tty:
                    self.bar.refresh()
                elif line or time.monotonic() - self._last_line >= self._line_every_s:
                    self._last_line = time.monotonic()
                    self._print_line()
        if self._listener is not None:
            self._listener(snap)

    def _print_line(self) -> None:
        text = self.bar.format_meter(**{**self.bar.format_dict, "ncols": 0})
        if text != self._last_text:  # a tick and the close in the same second would repeat it
            print(text, file=self._file, flush=True)
            self._last_text = text

    def _tick_loop(self) -> None:
        while not self._stop.wait(self._refresh_s):
            self.tick()

    def close(self) -> None:
        """Stop the ticker; a non-terminal display writes its last line."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        read = _safe_read(self._tokens)
        with self._lock:
            if self._enabled:
                self._set_postfix(self._snapshot(read))
                if not self._tty:
                    self._print_line()
            self.bar.close()
            if self._sink is not None:
                self._sink.close()

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_tty(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


def _safe_read(tokens: Callable[[], int] | None) -> int | None:
    """The counter's value; None when there is no counter or it cannot answer now (a busy remote engine)."""
    if tokens is None:
        return None
    try:
        return int(tokens())
    except Exception:  # noqa: BLE001 - a display must never stop the work it shows
        return None
