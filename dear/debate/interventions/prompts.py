"""The requests of the intervention calls: the judge's, DRIFTPolicy's and the moderator's messages for a round
(pair), and `intervention_request`, the seeded `ChatRequest` that carries them (the live protocol and
eval/judge_offline.py send the same requests)."""

from __future__ import annotations

from collections.abc import Sequence

from dear.debate.engine import Debate
from dear.debate.interventions.config import ERROR_TYPES, JUDGE_PROMPTS, STAGE_INSTRUCTIONS
from dear.debate.prompts import render_answer
from dear.debate.trace import AgentTurn, DebateTrace
from dear.llm.base import ChatMessage, ChatRequest
from dear.seeds import derive_seed
from dear.tasks import Question, render_question

_KIND_SEED = {"judge": 0x1D6E, "policy": 0x9011, "moderator": 0x30D}
JUDGE_SYSTEM = "You are DRIFTJudge, a strict and concise reviewer of multi-agent discussions."
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
