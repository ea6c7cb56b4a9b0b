"""Debate interventions from the seed papers, wrapped around any protocol (MAD, the DEAR regulator, ...).

- DRIFTJudge (seed 000): after each exchange round one judge call per debate sees the previous and the current
  round's solutions and answers "Verdict: DRIFT | NO DRIFT" with a reason. Unparsable output counts as no drift
  and is marked `malformed`. Under a prompt that `names_answer` ("verify") the judge instead names the answer it
  finds correct, and FOCUS with that answer as the key decides drift; a round whose plurality did not change
  cannot drift under any key, so it gets no call (recorded as `skipped`).
- DRIFTPolicy (seed 000): on a flagged round a feedback call names the error types (seed 000's taxonomy) and
  writes advice; the advice is added to every debater's prompt of the NEXT round (RoundControl.guidance).
- Regenerate (seed 000): a flagged round is dropped and run again once at a non-zero temperature
  (DebateEngine.redo_last_round); a redone round is never judged or redone again.
- Moderator (seed 002): before the next round, one call per new answer rates relevance (0-1) and conflict
  (none / redundant / contradiction) as JSON. Relevance below the threshold -> the answer is ignored (peers do not
  see it next round); redundant, or refused by the moderator -> demoted (peers see its one-line summary and final
  answer); otherwise accepted. Unparsable output -> accepted, marked `malformed`. The answers of the last round
  are not rated: nobody reads them afterwards.
- Agenda (seed 002): problem definition -> argument -> rebuttal -> evidence -> synthesis. Each exchange round
  gets its stage's instruction; the stage advances after `agenda_quiet_rounds` rounds without a new
  contradiction (from the moderator's ratings) or after `agenda_max_stage_rounds` rounds in the stage.

Every extra call is recorded in the trace (`DebateTrace.extra_calls`) with its tokens, apart from the debaters'
tokens; a dropped round's turns go to `discarded_rounds` and their tokens to the extra tally too. Round 0 is never
changed, so it stays identical (and cache-shared) with the plain protocol's round 0.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dear import metrics, tasks
from dear.debate.engine import T_MAX, Debate, DebateEngine, RoundControl
from dear.seeds import derive_seed
from dear.debate.prompts import render_answer
from dear.debate.trace import AgentTurn, DebateTrace, ExtraCall
from dear.llm.base import Backend, ChatMessage, ChatRequest, Completion
from dear.tasks import Question, render_question
from dear.vote import tally

log = logging.getLogger(__name__)

ERROR_TYPES = (
    "lack of progress", "low-quality feedback", "low-quality engagement",  # temporal (seed 000)
    "lack of clarity", "task non-compliance", "knowledge gap", "logical error", "language error",  # local
)
AGENDA_STAGES = ("problem_definition", "argument", "rebuttal", "evidence", "synthesis")
STAGE_INSTRUCTIONS = {
    "problem_definition": "Agenda stage: problem definition. In this round, restate what exactly is asked, the "
                          "given quantities and constraints, and correct any misreading of the problem.",
    "argument": "Agenda stage: argument. In this round, state your core claim and the reasoning that supports it.",
    "rebuttal": "Agenda stage: rebuttal. In this round, point out concrete logical gaps or factual errors in the "
                "other answers (or confirm they hold); do not introduce unrelated new claims.",
    "evidence": "Agenda stage: evidence. In this round, verify the disputed steps by explicit calculation or "
                "checkable facts; do not propose new arguments.",
    "synthesis": "Agenda stage: synthesis. In this round, summarise what the discussion has established and "
                 "settle on the best-supported answer.",
}
CONFLICTS = ("none", "redundant", "contradiction")
_KIND_SEED = {"judge": 0x1D6E, "policy": 0x9011, "moderator": 0x30D}


# ---------------------------------------------------------------- configuration
@dataclass(frozen=True)
class InterventionConfig:
    judge: bool = False
    policy: bool = False  # needs judge
    regenerate: bool = False  # needs judge
    moderator: bool = False
    agenda: bool = False  # needs moderator (its conflict ratings drive the stages)
    judge_final_round: bool = True  # judge the last round too (only detection; policy has no next round there)
    judge_temperature: float = 0.0
    judge_prompt: str = "verify-cot"  # a key of JUDGE_PROMPTS; the default is the best measured on the corpus
    judge_max_tokens: int | None = None  # None = the prompt's own budget (JudgePrompt.max_tokens)
    policy_max_tokens: int = 200
    moderator_max_tokens: int = 160
    solution_chars: int = 600  # reasoning characters of each solution shown to the judge / moderator
    regenerate_temperature: float = 1.0  # a redone round samples at least this hot
    relevance_threshold: float = 0.7  # seed 002's default
    agenda_quiet_rounds: int = 2  # rounds without new contradiction that end a stage
    agenda_max_stage_rounds: int = 2  # rounds after which a stage ends anyway

    def __post_init__(self):
        if (self.policy or self.regenerate) and not self.judge:
            raise ValueError("InterventionConfig: policy and regenerate act on the judge's verdicts; set judge=True")
        if self.policy and self.regenerate:
            raise ValueError("InterventionConfig: choose policy or regenerate (seed 000 compares them separately)")
        if self.agenda and not self.moderator:
            raise ValueError("InterventionConfig: agenda advances on the moderator's conflict ratings; "
                             "set moderator=True")
        if not 0.0 <= self.relevance_threshold <= 1.0:
            raise ValueError(f"InterventionConfig.relevance_threshold must be in [0, 1], got {self.relevance_threshold}")
        if not 0.0 < self.regenerate_temperature <= T_MAX:
            raise ValueError(f"InterventionConfig.regenerate_temperature must be in (0, {T_MAX}], "
                             f"got {self.regenerate_temperature}")
        if self.judge_prompt not in JUDGE_PROMPTS:
            raise ValueError(f"InterventionConfig.judge_prompt must be one of {sorted(JUDGE_PROMPTS)}, "
                             f"got {self.judge_prompt!r}")
        if not 0.0 <= self.judge_temperature <= T_MAX:
            raise ValueError(f"InterventionConfig.judge_temperature must be in [0, {T_MAX}], got {self.judge_temperature}")
        for name in ("judge_tokens", "policy_max_tokens", "moderator_max_tokens", "agenda_quiet_rounds",
                     "agenda_max_stage_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"InterventionConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.solution_chars < 0:
            raise ValueError(f"InterventionConfig.solution_chars must be >= 0, got {self.solution_chars}")

    @property
    def judge_tokens(self) -> int:
        """The judge's completion budget: `judge_max_tokens`, or the prompt's own."""
        return self.judge_max_tokens or JUDGE_PROMPTS[self.judge_prompt].max_tokens

    @property
    def any(self) -> bool:
        return self.judge or self.moderator

    def label(self) -> str:
        """`judge+policy`, `moderator`, ... (the suffix of a method name)."""
        parts = [n for n in ("judge", "policy", "regenerate") if getattr(self, n)]
        if self.moderator:
            parts.append("moderator" if self.agenda else "moderator-noagenda")
        return "+".join(parts)


# ---------------------------------------------------------------- parsing model output
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


# ---------------------------------------------------------------- agenda state machine
@dataclass
class AgendaState:
    """Seed 002's agenda: the stage of the next round; `record_round(conflict)` after each rated round."""

    quiet_to_advance: int = 2
    max_stage_rounds: int = 2
    index: int = 0
    rounds_in_stage: int = 0
    quiet_rounds: int = 0
    rounds_per_stage: dict[str, int] = field(default_factory=dict)

    @property
    def stage(self) -> str:
        return AGENDA_STAGES[self.index]

    @property
    def instruction(self) -> str:
        return STAGE_INSTRUCTIONS[self.stage]

    def record_round(self, new_conflict: bool) -> bool:
        """Count one finished round of the current stage; returns True when the stage advanced."""
        self.rounds_in_stage += 1
        self.rounds_per_stage[self.stage] = self.rounds_per_stage.get(self.stage, 0) + 1
        self.quiet_rounds = 0 if new_conflict else self.quiet_rounds + 1
        last = self.index == len(AGENDA_STAGES) - 1
        if not last and (self.quiet_rounds >= self.quiet_to_advance or self.rounds_in_stage >= self.max_stage_rounds):
            self.index += 1
            self.rounds_in_stage = self.quiet_rounds = 0
            return True
        return False


# ---------------------------------------------------------------- prompts
JUDGE_SYSTEM = "You are DRIFTJudge, a strict and concise reviewer of multi-agent discussions."


@dataclass(frozen=True)
class JudgePrompt:
    """One DRIFTJudge instruction (a format string over prev, cur, prev_answers, cur_answers) and its reply.

    `names_answer`: the judge replies with the answer it finds correct (`\\boxed{}`), not a verdict; drift is
    then FOCUS < 0 with that answer as the key (`judge_verdict`), and rounds whose plurality did not change
    need no call (`needs_judge_call`).
    """

    template: str
    max_tokens: int = 160
    names_answer: bool = False


# The judge's instruction, by name (InterventionConfig.judge_prompt). "basic" asks for the verdict first, in seed
# 000's terms. "stepwise" lists both rounds' final answers, says what is not drift and asks for the comparison
# before the verdict: a 1.5B judge under "basic" called 17 of 18 pilot rounds drift, 16 of them unchanged.
# Measured on 48-71 corpus round pairs, neither discriminates (basic flags ~all, stepwise ~none;
# results/judge-gsm8k-train). "verify" asks the judge to check the problem and name the correct answer, so it
# only has to verify, which is what FOCUS measures; the 1.5B judge then names an answer in ~11 tokens without
# checking. "verify-cot" asks for its own solution first.
JUDGE_PROMPTS = {
    "basic": JudgePrompt(
        "Problem drift means that a discussion moves away from solving its problem: the newer round's solutions "
        "are worse than the previous round's (a correct line of reasoning was abandoned, a well-supported answer "
        "was changed without a good reason, the agents went off topic or stopped following the task). "
        "Did the discussion drift from round {prev} to round {cur}?\n"
        "Reply in exactly this format:\nVerdict: DRIFT or NO DRIFT\nReason: <one sentence>"
    ),
    "stepwise": JudgePrompt(
        "Final answers in round {prev}: {prev_answers}. Final answers in round {cur}: {cur_answers}.\n"
        "Problem drift means the newer round is a step backwards on this problem: an agent gave up a "
        "well-supported answer for a worse one, the reasoning became wrong or irrelevant, or an agent stopped "
        "following the task. Agents keeping their answers, agreeing after checking, or correcting a mistake is "
        "not drift. Most rounds do not drift.\n"
        "First compare the two rounds in one sentence, then decide whether round {cur} drifted.\n"
        "Reply in exactly this format:\nReason: <one sentence>\nVerdict: NO DRIFT or DRIFT"
    ),
    "verify": JudgePrompt(
        "Final answers in round {prev}: {prev_answers}. Final answers in round {cur}: {cur_answers}.\n"
        "The agents changed their answers, so at most one of these answers is right. Check the agents' "
        "reasoning against the problem and work out briefly, step by step, which final answer is correct.\n"
        "End with exactly this line:\nCorrect answer: \\boxed{{<the correct final answer>}}",
        max_tokens=384, names_answer=True,
    ),
    "verify-cot": JudgePrompt(
        "Final answers in round {prev}: {prev_answers}. Final answers in round {cur}: {cur_answers}.\n"
        "The agents changed their answers, so at most one of these answers is right. Do not trust the agents: "
        "solve the problem yourself, step by step, then say which final answer is correct.\n"
        "Reply in exactly this format:\nCheck: <your own step-by-step solution>\n"
        "Correct answer: \\boxed{{<the correct final answer>}}",
        max_tokens=384, names_answer=True,
    ),
}
POLICY_SYSTEM = "You are a feedback agent that helps a multi-agent discussion stay on its problem."
POLICY_TASK = (
    "A judge found that the discussion drifted in round {cur}: {reason}\n"
    "Which of these error types caused it: " + ", ".join(ERROR_TYPES) + "? "
    "Then give the discussants short, concrete advice (at most three sentences) on how to get back on track. "
    "Do not solve the problem yourself.\n"
    "Reply in exactly this format:\nError types: <comma-separated error types>\nAdvice: <your advice>"
)
ADVICE_PREFIX = "Feedback on the discussion (the last round drifted from the problem{types}): "
MODERATOR_SYSTEM = "You are the moderator of a multi-agent discussion. You judge contributions; you do not answer."
MODERATOR_TASK = (
    "Judge whether the candidate answer is relevant to the original question{stage_part} and whether it adds a "
    "conflict with the earlier answers (contradiction), only repeats them (redundant) or neither (none).\n"
    'Reply with JSON only: {{"relevance": <number from 0.0 to 1.0>, "conflict": "none" | "redundant" | '
    '"contradiction", "accept": true | false, "summary": "<the answer in one line>", "reason": "<short reason>"}}'
)


def _clip(text: str, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[:n] + " ..."


def _solution(turn: AgentTurn, n_chars: int) -> str:
    parts = [f"Agent {turn.agent + 1}:"]
    if n_chars:
        parts.append(f"Reasoning: {_clip(turn.reasoning, n_chars)}")
    parts += [f"Conclusion: {_clip(turn.conclusion, 300)}", f"Final answer: {render_answer(turn.answer)}"]
    return "\n".join(parts)


def judge_messages(question: Question, prev: Sequence[AgentTurn], cur: Sequence[AgentTurn], n_chars: int,
                   prompt: str = "basic") -> list[ChatMessage]:
    """The judge's request for one round pair: the problem, both rounds' solutions, the named instruction."""
    r = cur[0].round
    task = JUDGE_PROMPTS[prompt].template.format(
        prev=r - 1, cur=r, prev_answers=_answer_list(prev), cur_answers=_answer_list(cur))
    user = "\n\n".join([
        f"Problem:\n{render_question(question)}",
        f"Solutions in round {r - 1}:\n" + "\n\n".join(_solution(t, n_chars) for t in prev),
        f"Solutions in round {r}:\n" + "\n\n".join(_solution(t, n_chars) for t in cur),
        task,
    ])
    return [ChatMessage("system", JUDGE_SYSTEM), ChatMessage("user", user)]


def _answer_list(turns: Sequence[AgentTurn]) -> str:
    return ", ".join(f"Agent {t.agent + 1}: {render_answer(t.answer)}" for t in turns)


def policy_messages(debate: Debate, prev: Sequence[AgentTurn], cur: Sequence[AgentTurn], reason: str,
                    n_chars: int) -> list[ChatMessage]:
    r = cur[0].round
    user = "\n\n".join([
        f"Problem:\n{render_question(debate.question)}",
        f"Solutions in round {r - 1}:\n" + "\n\n".join(_solution(t, n_chars) for t in prev),
        f"Solutions in round {r}:\n" + "\n\n".join(_solution(t, n_chars) for t in cur),
        POLICY_TASK.format(cur=r, reason=reason or "(no reason given)"),
    ])
    return [ChatMessage("system", POLICY_SYSTEM), ChatMessage("user", user)]


def moderator_messages(debate: Debate, candidate: AgentTurn, stage: str | None, n_chars: int) -> list[ChatMessage]:
    """Candidate = one new answer; earlier answers = the previous round (round 0: the other first answers)."""
    r = candidate.round
    rounds = debate.trace.rounds
    if r >= 1:
        earlier = [f"- Agent {t.agent + 1}: {_clip(t.conclusion, 200)} (final answer {render_answer(t.answer)})"
                   for t in rounds[r - 1]]
        earlier_title = f"Earlier answers (round {r - 1}):"
    else:
        earlier = [f"- Agent {t.agent + 1}: {_clip(t.conclusion, 200)} (final answer {render_answer(t.answer)})"
                   for t in rounds[0] if t.agent != candidate.agent]
        earlier_title = "The other agents' first answers:"
    stage_part = ""
    parts = [f"Original question:\n{render_question(debate.question)}"]
    if stage is not None:
        parts.append(f"Current agenda stage: {STAGE_INSTRUCTIONS[stage]}")
        stage_part = " and the current agenda stage"
    parts += [
        earlier_title + "\n" + ("\n".join(earlier) or "(none)"),
        f"Candidate answer (Agent {candidate.agent + 1}, round {r}):\n"
        f"Reasoning: {_clip(candidate.reasoning, max(n_chars, 1))}\nConclusion: {_clip(candidate.conclusion, 300)}\n"
        f"Final answer: {render_answer(candidate.answer)}",
        MODERATOR_TASK.format(stage_part=stage_part),
    ]
    return [ChatMessage("system", MODERATOR_SYSTEM), ChatMessage("user", "\n\n".join(parts))]


def intervention_request(kind: str, messages: Sequence[ChatMessage], seed: int, trace: DebateTrace, rnd: int,
                         agent: int | None, temperature: float, max_tokens: int) -> ChatRequest:
    """The request of one judge / policy / moderator call on round `rnd` of the debate `trace` records; its seed
    derives from the run seed, the debate's seed, the kind, the round and the rated agent (None = whole round)."""
    return ChatRequest(
        messages=tuple(messages), temperature=temperature, top_p=1.0, max_tokens=max_tokens,
        seed=derive_seed(seed, trace.seed, _KIND_SEED[kind], rnd, -1 if agent is None else agent),
        metadata={"debate_id": trace.debate_id, "question_id": trace.question_id, "task": trace.task,
                  "intervention": kind, "round": rnd, "rated_agent": agent},
    )


# ---------------------------------------------------------------- the wrapper
@dataclass
class _DebateState:
    agenda: AgendaState | None = None
    advice: str | None = None  # DRIFTPolicy advice for the next round
    ignored: set[int] = field(default_factory=set)  # agents whose last answer peers must not see
    control: RoundControl | None = None  # the control of the last round (for a redo)


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


class InterventionProtocol:
    """Any protocol (`n_rounds` + `controls(debates)`) with the configured interventions switched on.

    Use `run(engine, questions)` instead of `engine.run(questions, protocol)`: the interventions need the engine
    between rounds (extra calls, redoing a round). `backend` serves the judge, feedback and moderator calls;
    None = the backend of the engine's agent 0 (the debaters' own model, as in seed 000).
    """

    def __init__(self, protocol, config: InterventionConfig, backend: Backend | None = None,
                 name: str | None = None):
        if not config.any:
            raise ValueError("InterventionProtocol: no intervention switched on (judge or moderator)")
        self.protocol = protocol
        self.config = config
        self.backend = backend
        self.name = name or f"{getattr(protocol, 'name', type(protocol).__name__)}+{config.label()}"

    @property
    def n_rounds(self) -> int:
        return self.protocol.n_rounds

    @property
    def records(self):
        """The wrapped protocol's per-debate records (the DEAR regulator's decisions), if it keeps any."""
        return getattr(self.protocol, "records", None)

    # ------------------------------------------------------------ driving debates
    def run(self, engine: DebateEngine, questions, debate_seeds: Sequence[int] | None = None,
            on_round: Callable[[int, list[Debate]], None] | None = None) -> list[Debate]:
        """Whole debates under the wrapped protocol plus the interventions (same results shape as engine.run)."""
        debates = engine.start(questions, debate_seeds, n_rounds=self.n_rounds, protocol=self.name)
        if on_round:
            on_round(0, debates)
        return self.drive(engine, debates, on_round)

    def drive(self, engine: DebateEngine, debates: list[Debate],
              on_round: Callable[[int, list[Debate]], None] | None = None) -> list[Debate]:
        """The exchange rounds, with the interventions, of debates that have run round 0 (from `engine.start`
        or a stored round 0 via `engine.start_from_round0`)."""
        cfg = self.config
        backend = self.backend or engine.backends[engine.agent_keys[0]]
        states = {d.debate_id: _DebateState(
            agenda=AgendaState(cfg.agenda_quiet_rounds, cfg.agenda_max_stage_rounds) if cfg.agenda else None)
            for d in debates}
        r = 0
        while active := [d for d in debates if not d.done]:
            r += 1
            if cfg.moderator:
                self._moderate(engine, backend, active, states)
            controls = self._controls(active, states)
            for d, ctl in zip(active, controls):
                states[d.debate_id].control = ctl
            engine.step(active, controls)
            if cfg.judge:
                self._judge_round(engine, backend, [d for d in active if not d.failed], states)
            if on_round:
                on_round(r, debates)
        return debates

    def _controls(self, debates: list[Debate], states: dict[str, _DebateState]) -> list[RoundControl]:
        """The wrapped protocol's controls, minus ignored answers, plus advice and the agenda instruction."""
        out = []
        for d, ctl in zip(debates, self.protocol.controls(debates)):
            st = states[d.debate_id]
            mask = np.array(ctl.mask, dtype=bool)
            for j in st.ignored:
                mask[:, j] = False
            notes = [n for n in (st.advice, st.agenda.instruction if st.agenda else None) if n]
            guidance = ctl.guidance
            if notes:
                extra = "\n".join(notes)
                base = ctl.guidance or (None,) * ctl.n_agents
                guidance = tuple(f"{g}\n{extra}" if g else extra for g in base)
            out.append(RoundControl(mask, ctl.temperature.copy(), ctl.top_p.copy(), guidance))
            if st.agenda:
                d.trace.add_extra_call(ExtraCall("agenda", d.round + 1, 0, 0,
                                                 result={"stage": st.agenda.stage}))
            st.advice = None
        return out

    # ------------------------------------------------------------ extra calls
    def _call(self, engine: DebateEngine, backend: Backend, kind: str, jobs: list[tuple[Debate, int, int | None,
              list[ChatMessage]]], max_tokens: int, temperature: float) -> list[Completion]:
        """One batched generate call; a failing batch becomes error completions (the debates go on)."""
        reqs = [intervention_request(kind, msgs, engine.config.seed, d.trace, rnd, agent, temperature, max_tokens)
                for d, rnd, agent, msgs in jobs]
        if not reqs:
            return []
        try:
            comps = backend.generate(reqs)
            if len(comps) != len(reqs):
                raise RuntimeError(f"{len(comps)} completions for {len(reqs)} requests")
        except Exception as e:  # an intervention failure must not fail the debates
            log.exception("%s calls failed on a batch of %d", kind, len(reqs))
            comps = [Completion("", 0, 0, "error", 0.0, error=f"{type(e).__name__}: {e}") for _ in reqs]
        return comps

    def _judge_round(self, engine: DebateEngine, backend: Backend, debates: list[Debate],
                     states: dict[str, _DebateState]) -> None:
        cfg = self.config
        judged = [d for d in debates if d.round >= 1 and (cfg.judge_final_round or not d.done)
                  and d.last_turns[0].attempt == 0]
        todo = [d for d in judged if needs_judge_call(cfg.judge_prompt, d.trace.rounds[-2], d.last_turns)]
        jobs = [(d, d.round, None, judge_messages(d.question, d.trace.rounds[-2], d.last_turns,
                                             cfg.solution_chars, cfg.judge_prompt))
                for d in todo]
        comps = dict(zip((d.debate_id for d in todo),
                         self._call(engine, backend, "judge", jobs, cfg.judge_tokens, cfg.judge_temperature)))
        flagged = []
        for d in judged:
            prev, cur = d.trace.rounds[-2], d.last_turns
            c = comps.get(d.debate_id, Completion("", 0, 0, "skipped", 0.0))
            if d.debate_id not in comps:
                v = JudgeVerdict(False, SKIPPED_REASON)
            elif c.error is not None:
                v = JudgeVerdict(False, f"error: {c.error}", True)
            else:
                v = judge_verdict(cfg.judge_prompt, c.text, d.question, prev, cur)
            d.trace.add_extra_call(ExtraCall(
                "judge", d.round, c.prompt_tokens, c.completion_tokens, c.text or "",
                {"drifted": v.drifted, "malformed": v.malformed, "reason": v.reason,
                 "skipped": d.debate_id not in comps, "prev": round_outcome(prev), "cur": round_outcome(cur)},
                error=c.error))
            if v.drifted:
                flagged.append((d, v))
        if not flagged:
            return
        if cfg.regenerate:
            redo = [d for d, _ in flagged]
            engine.redo_last_round(redo, [self._hotter(states[d.debate_id].control) for d in redo])
        if cfg.policy:
            self._advise(engine, backend, [(d, v) for d, v in flagged if not d.done], states)

    def _hotter(self, ctl: RoundControl | None) -> RoundControl:
        if ctl is None:
            raise RuntimeError("regenerate: no control recorded for the round to redo")
        t = np.maximum(ctl.temperature, self.config.regenerate_temperature)
        return RoundControl(ctl.mask.copy(), t, ctl.top_p.copy(), ctl.guidance)

    def _advise(self, engine: DebateEngine, backend: Backend, flagged: list[tuple[Debate, JudgeVerdict]],
                states: dict[str, _DebateState]) -> None:
        cfg = self.config
        jobs = [(d, d.round, None, policy_messages(d, d.trace.rounds[-2], d.last_turns, v.reason, cfg.solution_chars))
                for d, v in flagged]
        comps = self._call(engine, backend, "policy", jobs, cfg.policy_max_tokens, cfg.judge_temperature)
        for (d, _), c in zip(flagged, comps):
            a = parse_advice(c.text) if c.error is None else Advice("", (), True)
            d.trace.add_extra_call(ExtraCall(
                "policy", d.round, c.prompt_tokens, c.completion_tokens, c.text or "",
                {"advice": a.text, "error_types": list(a.error_types), "malformed": a.malformed}, error=c.error))
            if not a.malformed:
                types = f"; error types: {', '.join(a.error_types)}" if a.error_types else ""
                states[d.debate_id].advice = ADVICE_PREFIX.format(types=types) + a.text

    def _moderate(self, engine: DebateEngine, backend: Backend, debates: list[Debate],
                  states: dict[str, _DebateState]) -> None:
        """Rate every answer of each debate's last round; set what peers will see of it next round."""
        cfg = self.config
        jobs = []
        for d in debates:
            st = states[d.debate_id]
            st.ignored = set()
            stage = st.agenda.stage if st.agenda and d.round >= 1 else None  # round 0 ran under no stage
            jobs += [(d, d.round, t.agent, moderator_messages(d, t, stage, cfg.solution_chars)) for t in d.last_turns]
        comps = self._call(engine, backend, "moderator", jobs, cfg.moderator_max_tokens, cfg.judge_temperature)
        conflict: dict[str, bool] = {}
        for (d, rnd, agent, _), c in zip(jobs, comps):
            st = states[d.debate_id]
            rating = parse_rating(c.text) if c.error is None else ModeratorRating(
                1.0, "none", None, "", f"error: {c.error}", malformed=True)
            action = moderator_action(rating, cfg.relevance_threshold)
            turn = d.last_turns[agent]
            if action == "ignore":
                st.ignored.add(agent)
            elif action == "demote":
                turn.peer_summary = rating.summary or _clip(turn.conclusion, 200)
            conflict[d.debate_id] = conflict.get(d.debate_id, False) or (
                not rating.malformed and rating.conflict == "contradiction")
            d.trace.add_extra_call(ExtraCall(
                "moderator", rnd, c.prompt_tokens, c.completion_tokens, c.text or "",
                {"relevance": rating.relevance, "conflict": rating.conflict, "accept": rating.accept,
                 "summary": rating.summary, "reason": rating.reason, "malformed": rating.malformed,
                 "action": action}, agent=agent, error=c.error))
        for d in debates:
            st = states[d.debate_id]
            if st.agenda and d.round >= 1:
                st.agenda.record_round(conflict.get(d.debate_id, False))


# ---------------------------------------------------------------- summaries (for reports)
@dataclass
class InterventionSummary:
    """What the interventions did and cost over a set of traces."""

    n_debates: int
    calls: dict[str, int]  # extra calls by kind ("regenerate" = discarded debater rounds)
    tokens: dict[str, int]  # their prompt + completion tokens by kind
    debater_tokens: int  # kept debater turns
    judge_verdicts: int = 0  # judged round pairs, skipped ones (no call needed) included
    judge_skipped: int = 0
    judge_flagged: int = 0
    judge_malformed: int = 0
    policy_advice: int = 0
    policy_malformed: int = 0
    regenerated_rounds: int = 0
    moderator_rated: int = 0
    moderator_actions: dict[str, int] = field(default_factory=dict)
    moderator_malformed: int = 0
    stage_rounds: dict[str, int] = field(default_factory=dict)  # exchange rounds run in each agenda stage

    @property
    def extra_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def overhead(self) -> float:
        """Extra tokens / debater tokens."""
        return self.extra_tokens / self.debater_tokens if self.debater_tokens else math.nan

    @property
    def rejection_rate(self) -> float:
        """Share of rated answers the moderator ignored or demoted."""
        rejected = self.moderator_actions.get("ignore", 0) + self.moderator_actions.get("demote", 0)
        return rejected / self.moderator_rated if self.moderator_rated else math.nan

    def to_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"debates": self.n_debates, "debater_tokens": self.debater_tokens,
                               "extra_tokens": self.extra_tokens, "overhead": self.overhead}
        for k in sorted(self.calls):
            row[f"{k}_calls"], row[f"{k}_tokens"] = self.calls[k], self.tokens.get(k, 0)
        row.update(judge_verdicts=self.judge_verdicts, judge_skipped=self.judge_skipped, judge_flagged=self.judge_flagged,
                   judge_malformed=self.judge_malformed, policy_advice=self.policy_advice,
                   policy_malformed=self.policy_malformed, regenerated_rounds=self.regenerated_rounds,
                   moderator_rated=self.moderator_rated, moderator_malformed=self.moderator_malformed,
                   rejection_rate=self.rejection_rate)
        for a in ("accept", "ignore", "demote"):
            row[f"moderator_{a}"] = self.moderator_actions.get(a, 0)
        for s in AGENDA_STAGES:
            row[f"rounds_{s}"] = self.stage_rounds.get(s, 0)
        return row


def summarize_interventions(traces: Sequence[DebateTrace]) -> InterventionSummary:
    calls: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    s = InterventionSummary(len(traces), {}, {}, sum(t.total_tokens for t in traces))
    for t in traces:
        for c in t.extra_calls:
            if c.kind == "agenda":
                stages[c.result.get("stage", "?")] += 1
                continue
            skipped = bool(c.result.get("skipped"))
            if not skipped:
                calls[c.kind] += 1
                tokens[c.kind] += c.prompt_tokens + c.completion_tokens
            malformed = bool(c.result.get("malformed"))
            if c.kind == "judge":
                s.judge_verdicts += 1
                s.judge_skipped += int(skipped)
                s.judge_flagged += int(bool(c.result.get("drifted")))
                s.judge_malformed += int(malformed)
            elif c.kind == "policy":
                s.policy_advice += int(not malformed)
                s.policy_malformed += int(malformed)
            elif c.kind == "regenerate":
                s.regenerated_rounds += 1
            elif c.kind == "moderator":
                s.moderator_rated += 1
                s.moderator_malformed += int(malformed)
                actions[c.result.get("action", "?")] += 1
    return replace(s, calls=dict(calls), tokens=dict(tokens), moderator_actions=dict(actions),
                   stage_rounds=dict(stages))


def judged_pairs(traces: Sequence[DebateTrace]) -> list[tuple[bool, dict, dict]]:
    """(judge said drift, previous round's answers/correct, judged round's answers/correct) of every judge call,
    including calls on rounds that were later regenerated (their turns are in `discarded_rounds`)."""
    out = []
    for t in traces:
        for c in t.extra_calls:
            if c.kind == "judge" and "prev" in c.result and "cur" in c.result:
                out.append((bool(c.result.get("drifted")), c.result["prev"], c.result["cur"]))
    return out
