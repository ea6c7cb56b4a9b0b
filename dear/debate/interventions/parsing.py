"""Reading the completions of the intervention calls: the judge's verdict, DRIFTPolicy's advice, the moderator's
rating and the action it implies. Unparsable output is never an error: it gives a result marked `malformed` with a
harmless default (no drift, no advice, accept)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from dear.debate.interventions.config import CONFLICTS, ERROR_TYPES


@dataclass(frozen=True)
class JudgeVerdict:
    drifted: bool
    reason: str
    malformed: bool = False  # nothing parsable: counted as "no drift"


_VERDICT = re.compile(r"verdict\W{0,3}[:：]\W{0,3}(no[\s_-]*drift|not[\s_-]*drifted|drift(?:ed)?|yes|no)\b",
                      re.IGNORECASE)
_LEAD_VERDICT = re.compile(r"^[\s*#_>]*(no[\s_-]*drift|not[\s_-]*drifted|drift(?:ed)?)\b", re.IGNORECASE)
_REASON = re.compile(r"reason\W{0,3}[:：]\s*(.+)", re.IGNORECASE)


def _is_drift(word: str) -> bool:
    w = re.sub(r"[\s_-]+", " ", word.lower())
    return w in ("drift", "drifted", "yes")


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text` (code fences and prose around it allowed), or None."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text[m.start():])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def parse_verdict(text: str) -> JudgeVerdict:
    """A judge completion -> verdict. Accepts "Verdict: DRIFT|NO DRIFT|yes|no" lines, a leading DRIFT/NO DRIFT,
    or a JSON object with a boolean "drift"/"drifted"; anything else is malformed (= no drift)."""
    text = (text or "").strip()
    reason_m = _REASON.search(text)
    reason = reason_m.group(1).strip() if reason_m else ""
    obj = _json_object(text)
    if obj is not None:
        for key in ("drift", "drifted", "problem_drift"):
            if isinstance(obj.get(key), bool):
                return JudgeVerdict(obj[key], str(obj.get("reason", reason)))
        if isinstance(obj.get("verdict"), str) and (lead := _LEAD_VERDICT.match(obj["verdict"])):
            return JudgeVerdict(_is_drift(lead.group(1)), str(obj.get("reason", reason)))
    m = _VERDICT.search(text) or (_LEAD_VERDICT.match(text) if obj is None else None)
    if m is None:
        return JudgeVerdict(False, f"malformed verdict: {text[:200]!r}", malformed=True)
    return JudgeVerdict(_is_drift(m.group(1)), reason)


@dataclass(frozen=True)
class Advice:
    text: str
    error_types: tuple[str, ...]
    malformed: bool = False  # empty advice: nothing is added to the next round


_ADVICE = re.compile(r"advice\W{0,3}[:：]\s*(.*)", re.IGNORECASE | re.DOTALL)


def parse_advice(text: str, max_chars: int = 800) -> Advice:
    """A feedback completion -> advice text (after "Advice:", else the whole text) and the named error types."""
    text = (text or "").strip()
    found = tuple(t for t in ERROR_TYPES if t in re.sub(r"[\s_]+", " ", text.lower()))
    m = _ADVICE.search(text)
    body = (m.group(1) if m else text).strip()
    body = " ".join(body.split())[:max_chars]
    return Advice(body, found, malformed=not body)


@dataclass(frozen=True)
class ModeratorRating:
    relevance: float
    conflict: str  # one of CONFLICTS
    accept: bool | None  # the moderator's own accept flag, if it gave one
    summary: str
    reason: str
    malformed: bool = False  # unparsable: the answer is accepted


_RELEVANCE = re.compile(r"relevance\W{0,3}[:：]\s*([0-9]*\.?[0-9]+)", re.IGNORECASE)
_CONFLICT = re.compile(r"conflict\W{0,3}[:：]\W{0,3}(none|redundant|contradiction)", re.IGNORECASE)


def parse_rating(text: str) -> ModeratorRating:
    """A moderator completion -> rating. Wants a JSON object with "relevance" (0-1) and "conflict"; tolerates
    fences and prose, and falls back to `relevance: x` / `conflict: y` pairs. A missing or out-of-range
    relevance, or a missing conflict or one outside none/redundant/contradiction -> malformed (accept)."""
    text = (text or "").strip()
    obj = _json_object(text) or {}
    rel: Any = obj.get("relevance")
    conflict: Any = obj.get("conflict")
    if rel is None and (m := _RELEVANCE.search(text)):
        rel = m.group(1)
    if conflict is None and (m := _CONFLICT.search(text)):
        conflict = m.group(1)
    try:
        relevance = float(rel)
    except (TypeError, ValueError):
        relevance = math.nan
    conflict = str(conflict).strip().lower() if conflict is not None else ""
    if not math.isfinite(relevance) or not 0.0 <= relevance <= 1.0 or conflict not in CONFLICTS:
        return ModeratorRating(1.0, "none", None, "", f"malformed rating: {text[:200]!r}", malformed=True)
    accept = obj.get("accept") if isinstance(obj.get("accept"), bool) else None
    summary = " ".join(str(obj.get("summary") or "").split())
    return ModeratorRating(relevance, conflict, accept, summary, str(obj.get("reason") or ""))


def moderator_action(rating: ModeratorRating, threshold: float) -> str:
    """accept / ignore / demote: off-topic (relevance < threshold) is ignored, redundant or refused is demoted."""
    if rating.malformed:
        return "accept"
    if rating.relevance < threshold:
        return "ignore"
    if rating.conflict == "redundant" or rating.accept is False:
        return "demote"
    return "accept"
