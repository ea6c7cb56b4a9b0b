"""Graders: one per answer kind, each result names the grader that decided it.

- numeric (GSM8K, GSM-Hard): exact value for integer golds; a non-integer gold also accepts the prediction when
  they agree within 1e-9 relative, or when the prediction is the gold rounded to the decimals it shows
  (`21.67` for 21.666..., at least one decimal).
- integer (AIME): both must be integers with the same value (`"025"` == `25`).
- choice: letter compare (an answer given as the option's text maps to its letter); a letter that names none of
  the question's options (`E` with four) is no answer.
- math (MATH-500): `math-verify` (parse + verify). Its timeouts use SIGALRM, which only works in the main thread,
  so they are switched off elsewhere (worker threads, Ray actors). A pure-Python big-integer computation cannot
  be interrupted by a signal either, so inputs that could blow up (long, deeply nested, power towers, huge
  exponents or factorials) skip math-verify. When math-verify raises, times out or is skipped, a string/number
  check decides and the grader is recorded as "string".
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import signal
import threading
import time
from fractions import Fraction
from functools import lru_cache

from dear.tasks.extract import is_option, letter_for_text, normalize_answer, parse_number
from dear.tasks.types import GradeResult, Question

MV_TIMEOUT_S = 5
_MAX_MATH_CHARS = 300
_MAX_NESTING = 6

# math-verify logs a warning whenever its timeout is disabled; that is deliberate here (see module docstring).
logging.getLogger("math_verify").setLevel(logging.ERROR)


# ---------------------------------------------------------------- numeric / integer / choice
def _decimals(s: str) -> int:
    m = re.search(r"\.(\d+)$", s)
    return len(m.group(1)) if m else 0


def _round_half_up(x: Fraction, digits: int) -> Fraction:
    scale = 10**digits
    sign = -1 if x < 0 else 1
    return sign * Fraction(math.floor(abs(x) * scale + Fraction(1, 2)), scale)


def _grade_numeric(key: str, gold: str) -> GradeResult:
    p, g = parse_number(key), parse_number(normalize_answer(gold, "numeric"))
    if p is None or g is None:
        return GradeResult(False, "numeric", key)
    if g.denominator == 1 or p == g:
        return GradeResult(p == g, "numeric", key)
    close = abs(p - g) <= Fraction(1, 10**9) * max(abs(g), Fraction(1))
    d = _decimals(key)
    rounded = 1 <= d <= 12 and _round_half_up(g, d) == p
    return GradeResult(bool(close or rounded), "numeric", key)


def _grade_integer(key: str, gold: str) -> GradeResult:
    p, g = parse_number(key), parse_number(normalize_answer(gold, "integer"))
    ok = p is not None and g is not None and p.denominator == 1 and p == g
    return GradeResult(ok, "integer", key)


def _grade_choice(pred: str, question: Question) -> GradeResult:
    key = normalize_answer(pred, "choice")
    if key is None and question.choices:
        key = letter_for_text(pred, question.choices)
    if key is None or not is_option(key, question.choices):  # a letter past the last option is no answer
        return GradeResult(False, "none", None)
    return GradeResult(key == question.gold.strip().upper(), "choice", key)


# ---------------------------------------------------------------- math
_TOWER = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\(?\s*\d+\s*\^")
_BIG_EXP = re.compile(r"\^\s*\{?\s*-?\d{5,}|\d{4,}\s*!|\\binom\s*\{\s*\d{5,}|\d{40,}|\\(?:sum|prod|int)")


def _too_risky(s: str) -> bool:
    """Inputs that make sympy hang or crawl (tested: 9^{9^9}, 10^{10^{100}}, 1000000!, 46 nested braces)."""
    if len(s) > _MAX_MATH_CHARS or _TOWER.search(s) or _BIG_EXP.search(s):
        return True
    depth = deepest = 0
    for c in s:
        if c in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "})]":
            depth -= 1
    return deepest > _MAX_NESTING


@contextlib.contextmanager
def _keep_outer_timer():
    """math-verify's SIGALRM timeout cancels any ITIMER_REAL already running (e.g. pytest-timeout); re-arm it."""
    delay, interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    try:
        yield
    finally:
        if delay > 0:
            left = max(delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, interval)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@lru_cache(maxsize=8192)
def _mv_parse_cached(latex: str, timeout: int | None):
    from math_verify import parse

    return parse(f"${latex}$", parsing_timeout=timeout, raise_on_error=True)


def _math_verify(pred: str, gold: str) -> bool:
    """math-verify's verdict; raises (Exception or its BaseException TimeoutException) when it cannot decide."""
    from math_verify import verify

    timeout = MV_TIMEOUT_S if _in_main_thread() else None
    if _in_main_thread():
        with _keep_outer_timer():
            g, p = _mv_parse_cached(gold, timeout), _mv_parse_cached(pred, timeout)
            return verify(g, p, timeout_seconds=timeout, raise_on_error=True)
    g, p = _mv_parse_cached(gold, None), _mv_parse_cached(pred, None)
    return verify(g, p, timeout_seconds=None, raise_on_error=True)


def _string_check(key: str | None, gold_key: str | None) -> bool:
    if key is None or gold_key is None:
        return False
    if key == gold_key:
        return True
    p, g = parse_number(key), parse_number(gold_key)
    return p is not None and p == g


def _grade_math(pred: str, question: Question) -> GradeResult:
    key = normalize_answer(pred, "math")
    if key is None:
        return GradeResult(False, "none", None)
    gold_key = normalize_answer(question.gold, "math")
    if not (_too_risky(pred) or _too_risky(question.gold)):
        try:
            if _math_verify(pred.strip(), question.gold.strip()):
                return GradeResult(True, "math-verify", key)
            # math-verify said no: a light-normalised string match can still say yes (e.g. odd \text{} answers).
            if _string_check(key, gold_key):
                return GradeResult(True, "string", key)
            return GradeResult(False, "math-verify", key)
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
    return GradeResult(_string_check(key, gold_key), "string", key)


def math_keys_equal(a: str, b: str) -> bool | None:
    """Whether two normalised math keys are the same answer: equal strings or numbers, or math-verify's
    equivalence in both directions. Inputs that could make sympy hang get the string/number check only;
    None when math-verify raised or timed out (the caller decides what an undecided pair means)."""
    if _string_check(a, b):
        return True
    if _too_risky(a) or _too_risky(b):
        return False
    try:
        return _math_verify(a, b) and _math_verify(b, a)
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        return None


# ---------------------------------------------------------------- public API
def grade(pred: str | None, question: Question) -> GradeResult:
    """Compare an extracted answer (from `extract_answer`) with the question's gold answer. Never raises on `pred`."""
    if pred is None or not isinstance(pred, str) or not pred.strip():
        return GradeResult(False, "none", None)
    if question.kind == "choice":
        return _grade_choice(pred, question)
    if question.kind == "math":
        return _grade_math(pred, question)
    if question.kind not in ("numeric", "integer"):
        raise ValueError(f"question {question.id!r} has unknown answer kind {question.kind!r}")
    key = normalize_answer(pred, question.kind)
    if key is None:
        return GradeResult(False, "none", None)
    if question.kind == "numeric":
        return _grade_numeric(key, question.gold)
    return _grade_integer(key, question.gold)
