"""The one rule that turns a judge completion into a drift verdict, shared by the live protocol and the offline
judge (eval/judge_offline.py): a round's outcome, its FOCUS drift label, which round pairs need a judge call at
all, and `judge_verdict`."""

from __future__ import annotations

from collections.abc import Sequence

from dear import metrics, tasks
from dear.debate.interventions.config import JUDGE_PROMPTS
from dear.debate.interventions.parsing import JudgeVerdict, parse_verdict
from dear.debate.prompts import render_answer
from dear.debate.trace import AgentTurn
from dear.tasks import Question
from dear.vote import tally


def round_outcome(turns: Sequence[AgentTurn]) -> dict[str, list]:
    """One round's answer keys and correctness, the form a judge call records and FOCUS labels are computed from."""
    return {"answers": [t.answer_key for t in turns], "correct": [bool(t.correct) for t in turns]}


def focus_drift(prev: dict[str, list], cur: dict[str, list]) -> bool:
    """The FOCUS drift label of a judged round pair, from two `round_outcome`s."""
    return metrics.focus_drift_label(prev["answers"], prev["correct"], cur["answers"], cur["correct"])


def _plurality(turns: Sequence[AgentTurn]) -> set[str]:
    return set(tally([t.answer_key for t in turns]).leaders)


def needs_judge_call(prompt: str, prev: Sequence[AgentTurn], cur: Sequence[AgentTurn]) -> bool:
    """False when the judge's reply cannot matter: under an answer-naming prompt, a round pair whose plurality
    did not change has equal FOCUS scores under any answer key, so it is "no drift" without a call."""
    return not JUDGE_PROMPTS[prompt].names_answer or _plurality(prev) != _plurality(cur)


SKIPPED_REASON = "plurality unchanged: no drift under any answer, no call"


def judge_verdict(prompt: str, text: str, question: Question, prev: Sequence[AgentTurn],
                  cur: Sequence[AgentTurn]) -> JudgeVerdict:
    """The verdict of a judge completion under the named prompt. Verdict prompts: `parse_verdict`. Answer-naming
    prompts: the judge's `\\boxed{}` answer is taken as correct and FOCUS decides; no boxed answer is malformed."""
    if not JUDGE_PROMPTS[prompt].names_answer:
        return parse_verdict(text)
    answer = tasks.extract_answer(text or "", question.kind, question.choices, marked_only=True)
    key = tasks.normalize_answer(answer, question.kind)
    if key is None:
        return JudgeVerdict(False, f"malformed verdict: no boxed answer in {(text or '')[:200]!r}", malformed=True)
    prev_o, cur_o = round_outcome(prev), round_outcome(cur)
    as_if = {name: {"answers": o["answers"], "correct": [k == key for k in o["answers"]]}
             for name, o in (("prev", prev_o), ("cur", cur_o))}
    drifted = focus_drift(as_if["prev"], as_if["cur"])
    known = key in prev_o["answers"] or key in cur_o["answers"]
    return JudgeVerdict(drifted, f"judge's answer {render_answer(answer)}"
                        + ("" if known else " (no agent's)") + (": the plurality moved away from it" if drifted else ""))
