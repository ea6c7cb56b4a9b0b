"""The model's own confidence in one completion, from its token log-probabilities: one record per turn.

Summaries (each a mean of natural-log quantities over some tokens; higher = more confident):
- `mean_logprob`: the sampled tokens' mean log-probability (UAB, ReASC);
- `lowest_group`: DeepConf's group confidence, the lowest mean over sliding windows of `WINDOW` tokens of the token
  confidence c_i = -(mean of the k highest log-probabilities at token i) (the whole completion when shorter);
- `tail_mean`: the sampled tokens' mean log-probability over the last `TAIL` tokens (DeepConf's tail confidence);
- `answer_mean`: the mean log-probability of the tokens that overlap the final answer's last occurrence in the text
  (None when the answer is not found in it);
- `margin`: the mean gap between the two most likely tokens' log-probabilities (top-k margin; None when k < 2).

The per-token arrays are kept compactly (float16 / uint16, base64) in `per_token`, so that a new summary never needs
regeneration; every summary is computed from those stored values, so a record re-summarised from a trace equals the
one written. A turn whose backend sent no log-probabilities records `{"missing": reason}`, never a number; a record
computed afterwards from a stored text (teacher forcing, `eval.score_confidence`) says so in `scored_by`.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from dear.llm.base import TokenLogprobs

TOP_LOGPROBS = 5  # alternatives per token asked for: DeepConf's token confidence averages the top k; the margin needs 2
WINDOW = 16  # tokens per DeepConf group (GSM8K completions are ~150-300 tokens; DeepConf's 2,048 fits long traces)
TAIL = 32  # tokens of the tail mean
SUMMARIES = ("mean_logprob", "lowest_group", "tail_mean", "answer_mean", "margin")


def _encode(values: np.ndarray, dtype: np.dtype) -> str:
    return base64.b64encode(np.asarray(values).astype(dtype).tobytes()).decode("ascii")


def _decode(text: str, dtype: np.dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


F16, U16 = np.dtype("<f2"), np.dtype("<u2")


@dataclass(frozen=True)
class TokenArrays:
    """Per-token values, as stored: sampled log-probability, token confidence c_i, top-1 minus top-2 log-probability
    (NaN when fewer than 2 alternatives were returned) and UTF-8 length."""

    logprob: np.ndarray
    confidence: np.ndarray
    margin: np.ndarray
    nbytes: np.ndarray

    @classmethod
    def from_logprobs(cls, lp: TokenLogprobs) -> TokenArrays:
        chosen = np.asarray(lp.chosen, dtype=np.float64)
        conf = np.array([-np.mean(t) if t else -c for t, c in zip(lp.top, lp.chosen)], dtype=np.float64)
        margin = np.array([t[0] - t[1] if len(t) >= 2 else np.nan for t in lp.top], dtype=np.float64)
        nbytes = np.minimum(np.asarray(lp.nbytes, dtype=np.int64), np.iinfo(U16).max)
        # Rounded to the stored precision first, so a record re-read from a trace summarises to the same numbers.
        return cls(chosen.astype(F16), conf.astype(F16), margin.astype(F16), nbytes.astype(U16))

    def encode(self) -> dict[str, str]:
        return {"logprob": _encode(self.logprob, F16), "confidence": _encode(self.confidence, F16),
                "margin": _encode(self.margin, F16), "nbytes": _encode(self.nbytes, U16)}

    @classmethod
    def decode(cls, d: dict[str, str]) -> TokenArrays:
        return cls(_decode(d["logprob"], F16), _decode(d["confidence"], F16), _decode(d["margin"], F16),
                   _decode(d["nbytes"], U16))


@dataclass(frozen=True)
class ConfidenceRecord:
    """One completion's confidence summaries (module docstring) and how they were computed."""

    mean_logprob: float
    lowest_group: float
    tail_mean: float
    answer_mean: float | None
    margin: float | None
    # Tokens of the returned text. The backend's completion_tokens can be 1-4 more: the end-of-generation token and
    # a matched stop string are counted but carry no streamed log-probability (measured on the GSM8K bank).
    n_tokens: int
    k: int  # alternatives per token the backend returned (the top-k of `lowest_group` and `margin`)
    window: int = WINDOW
    tail: int = TAIL

    def value(self, name: str) -> float | None:
        if name not in SUMMARIES:
            raise KeyError(f"unknown confidence summary {name!r}; one of {SUMMARIES}")
        return getattr(self, name)


def _f(x: float) -> float:
    return round(float(x), 4)


def summarise(arrays: TokenArrays, answer_span: tuple[int, int] | None, k: int) -> ConfidenceRecord:
    """The record of one completion from its stored per-token arrays; `answer_span` = the answer's [start, end)
    byte offsets in the completion text (None: not found)."""
    lp = arrays.logprob.astype(np.float64)
    n = len(lp)
    if n == 0:
        raise ValueError("summarise: a completion without tokens has no confidence")
    conf = arrays.confidence.astype(np.float64)
    w = min(WINDOW, n)
    windows = np.convolve(conf, np.ones(w) / w, mode="valid")
    margins = arrays.margin.astype(np.float64)
    margin = None if np.isnan(margins).all() else _f(np.nanmean(margins))
    answer = None
    if answer_span is not None:
        ends = np.cumsum(arrays.nbytes.astype(np.int64))
        starts = ends - arrays.nbytes.astype(np.int64)
        inside = (starts < answer_span[1]) & (ends > answer_span[0])
        if inside.any():
            answer = _f(lp[inside].mean())
    return ConfidenceRecord(mean_logprob=_f(lp.mean()), lowest_group=_f(windows.min()), tail_mean=_f(lp[-TAIL:].mean()),
                            answer_mean=answer, margin=margin, n_tokens=n, k=k)


def answer_span(text: str, answer: str | None) -> tuple[int, int] | None:
    """Byte offsets [start, end) of the last occurrence of `answer` in `text` (None: no answer, or not in the text)."""
    if not answer:
        return None
    at = text.rfind(answer)
    if at < 0:
        return None
    start = len(text[:at].encode("utf-8"))
    return start, start + len(answer.encode("utf-8"))


def confidence_dict(logprobs: TokenLogprobs | None, text: str, answer: str | None, missing: str,
                    scored_by: str | None = None) -> dict[str, Any]:
    """What a trace stores for one turn: the record and its per-token arrays, or `{"missing": missing}` when the
    backend sent no log-probabilities (or no tokens). `scored_by`: set when the log-probabilities were computed
    afterwards by teacher forcing the stored text (`Backend.score`), not while sampling; stored as `SCORED_BY`."""
    if logprobs is None or not logprobs.chosen:
        return {"missing": missing}
    arrays = TokenArrays.from_logprobs(logprobs)
    k = max((len(t) for t in logprobs.top), default=0)
    record = summarise(arrays, answer_span(text, answer), k)
    return {**asdict(record), "per_token": arrays.encode(), **({SCORED_BY: scored_by} if scored_by else {})}


SCORED_BY = "scored_by"  # a stored record's note of the teacher forcing that computed it (absent: live)
_RECORD_FIELDS = frozenset(f.name for f in fields(ConfidenceRecord))


def record_of(stored: dict[str, Any] | None) -> ConfidenceRecord | None:
    """The record of a stored turn's confidence dict; None when it has none or it is missing."""
    if not stored or "missing" in stored:
        return None
    return ConfidenceRecord(**{k: v for k, v in stored.items() if k in _RECORD_FIELDS})


def resummarise(stored: dict[str, Any], text: str, answer: str | None) -> ConfidenceRecord:
    """The record recomputed from a stored dict's per-token arrays (e.g. after a re-grade moved the answer)."""
    return summarise(TokenArrays.decode(stored["per_token"]), answer_span(text, answer), int(stored["k"]))
