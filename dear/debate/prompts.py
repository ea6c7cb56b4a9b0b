"""Debate prompts and the parser for structured answers (Reasoning / Conclusion / Final answer).

Round 0: the question plus the task's format instruction. Exchange rounds come in two layouts:

- `multiturn` (Du et al.'s multi-agent debate format): each agent's conversation grows. Its own previous
  answers are assistant turns, verbatim, and the peers' answers arrive as the next user turn ("These are the
  answers to the problem from other agents: ... Using the other agents' answers as additional information, can
  you provide your answer to the problem?"). Everything before the new user turn is the prompt of the agent's
  previous call plus its own answer, so a server that keeps the agent on one KV-cache slot reads only the new turn.
- `single`: one fresh user message per round holding the question, the agent's own previous answer and the
  selected peers' answers (labelled "Agent j", 1-based), then the instruction to reconsider.

Peers' answers are re-rendered from their parsed parts so that their reasoning can be cut when the prompt would
overflow the context window while their conclusion and final answer stay. A peer answer a moderator demoted is
shown as its one-line summary plus its final answer. An optional per-agent `guidance` (an intervention's advice
or agenda instruction) goes into the exchange user turn just before the format instruction, in both layouts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dear import tasks
from dear.llm.base import ChatMessage
from dear.tasks.types import Question

NO_ANSWER = "(no answer)"
OMITTED = "(reasoning omitted to fit the context window)"

SYSTEM_PROMPT = (
    "You are a careful and rigorous problem solver taking part in a discussion with other agents. "
    "Think for yourself: keep your answer when your reasoning holds, change it when you find an error."
)

STRUCTURE = (
    "Reply in exactly this format:\n"
    "Reasoning: <your step-by-step reasoning>\n"
    "Conclusion: <one sentence stating your result>\n"
    "Final answer: <your final answer in the required form>"
)

RECONSIDER = (
    "Use the other agents' answers as additional information. Check their reasoning and your own step by "
    "step, then give your updated answer."
)
RECONSIDER_ALONE = "Check your previous reasoning step by step, then give your updated answer."

# The multi-turn layout's wording follows Du et al. (2023), "Improving Factuality and Reasoning in Language
# Models through Multiagent Debate", with our structured-answer instruction appended.
PEERS_INTRO = "These are the answers to the problem from other agents:"
PEERS_OUTRO = (
    "Using the other agents' answers as additional information, can you provide your answer to the problem?\n"
    "The original problem is:\n{question}"
)
ALONE = "Can you double check that your answer is correct? Please reiterate your answer."

LAYOUTS = ("multiturn", "single")


# ---------------------------------------------------------------- parsing
_HEADER = re.compile(
    r"^[ \t>*#_-]*(reasoning|conclusion|final answer)[ \t]*[*_]*[ \t]*[:：][ \t]*[*_]*[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class ParsedAnswer:
    reasoning: str  # never empty
    conclusion: str  # never empty
    final: str | None  # text of the "Final answer:" section, if the model wrote one


def _last_sentence(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    parts = [p.strip() for p in _SENTENCE_SPLIT.split(lines[-1]) if p.strip()]
    return parts[-1] if parts else lines[-1]


def parse_sections(text: str) -> ParsedAnswer:
    """Split a completion into reasoning / conclusion / final answer, tolerating real model output.

    The last occurrence of each header wins for conclusion and final answer (models sometimes draft first);
    the first wins for reasoning. Fallbacks: reasoning = the text before the first other header (or the whole
    text); conclusion = the last sentence of the reasoning, else the final-answer line; both become
    "(no answer)" rather than empty because they feed the sentence encoder.
    """
    text = text or ""
    matches = list(_HEADER.finditer(text))
    sections: dict[str, str] = {}
    first_other = None
    for k, m in enumerate(matches):
        name = m.group(1).lower()
        end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
        body = text[m.end() : end].strip()
        if name == "reasoning":
            sections.setdefault(name, body)
        else:
            if first_other is None:
                first_other = m.start()
            if body:
                sections[name] = body
    final = sections.get("final answer")
    reasoning = sections.get("reasoning") or ""
    if not reasoning:
        reasoning = (text[:first_other] if first_other is not None else text).strip()
    if not reasoning:
        reasoning = text.strip()
    conclusion = sections.get("conclusion") or _last_sentence(reasoning) or (final or "")
    if final is not None:
        final = final.strip().splitlines()[0].strip() if final.strip() else None
    return ParsedAnswer(reasoning=reasoning or NO_ANSWER, conclusion=conclusion.strip() or NO_ANSWER, final=final)


def extract(text: str, question: Question, truncated: bool = False) -> str | None:
    """The task extractor, applied to the "Final answer:" section first and then to the whole text.

    ``truncated`` (the completion was cut at the token limit): only a marked answer counts — a complete
    `\\boxed{}` or an answer phrase ("Final answer:", "The answer is", "####"); otherwise there is no answer,
    rather than the last number or formula line of unfinished reasoning."""
    if truncated:
        return tasks.extract_answer(text or "", question.kind, question.choices, marked_only=True)
    parsed = parse_sections(text)
    if parsed.final:
        ans = tasks.extract_answer(parsed.final, question.kind, question.choices)
        if ans is not None:
            return ans
    return tasks.extract_answer(text or "", question.kind, question.choices)


# ---------------------------------------------------------------- prompts
@dataclass(frozen=True)
class ShownAnswer:
    """A previous answer as it is shown in a later prompt."""

    agent: int
    reasoning: str
    conclusion: str
    answer: str | None
    summary: str | None = None  # set when a moderator demoted the answer: peers see only this line


def render_answer(answer: str | None) -> str:
    return NO_ANSWER if answer is None else f"\\boxed{{{answer}}}"


def _answer_block(a: ShownAnswer, omit_reasoning: bool) -> str:
    if a.summary is not None:
        return f"Summary (condensed by the moderator): {a.summary}\nFinal answer: {render_answer(a.answer)}"
    reasoning = OMITTED if omit_reasoning else a.reasoning
    return f"Reasoning: {reasoning}\nConclusion: {a.conclusion}\nFinal answer: {render_answer(a.answer)}"


def _instructions(question: Question) -> str:
    return f"{STRUCTURE}\n{tasks.format_instruction(question.kind)}"


def _guided(parts: list[str], guidance: str | None) -> list[str]:
    """`parts` with the guidance appended (blank guidance adds nothing)."""
    return [*parts, guidance.strip()] if guidance and guidance.strip() else parts


def round0_messages(question: Question, system_prompt: str = SYSTEM_PROMPT) -> list[ChatMessage]:
    user = f"Question:\n{tasks.render_question(question)}\n\n{_instructions(question)}"
    return [ChatMessage("system", system_prompt), ChatMessage("user", user)]


def exchange_messages(
    question: Question,
    own: ShownAnswer,
    peers: Sequence[ShownAnswer],
    n_truncated: int = 0,
    own_truncated: bool = False,
    system_prompt: str = SYSTEM_PROMPT,
    guidance: str | None = None,
) -> list[ChatMessage]:
    """Prompt for round r >= 1. The first `n_truncated` peer blocks lose their reasoning (context overflow);
    `guidance` is inserted before the format instruction."""
    parts = [
        f"Question:\n{tasks.render_question(question)}",
        f"Your previous answer:\n{_answer_block(own, own_truncated)}",
    ]
    if peers:
        blocks = [
            f"Agent {p.agent + 1}:\n{_answer_block(p, k < n_truncated)}" for k, p in enumerate(peers)
        ]
        parts.append("Answers from other agents:\n\n" + "\n\n".join(blocks))
        parts.append(RECONSIDER)
    else:
        parts.append(RECONSIDER_ALONE)
    parts = _guided(parts, guidance)
    parts.append(_instructions(question))
    return [ChatMessage("system", system_prompt), ChatMessage("user", "\n\n".join(parts))]


@dataclass(frozen=True)
class Exchange:
    """One earlier exchange of an agent, for the multi-turn layout: its answer of round k-1 (verbatim, and
    parsed for cutting) and the peers' round k-1 answers it is shown in round k."""

    own_text: str
    own: ShownAnswer
    peers: tuple[ShownAnswer, ...]
    guidance: str | None = None  # extra instruction of the round-k user turn


def peers_turn(question: Question, peers: Sequence[ShownAnswer], n_truncated: int = 0,
               guidance: str | None = None) -> str:
    """The user turn that brings the peers' answers (or, with no peer, the request to double-check);
    `guidance` is inserted before the format instruction."""
    if not peers:
        return "\n\n".join([*_guided([ALONE], guidance), _instructions(question)])
    blocks = [f"One agent's answer:\n```\n{_answer_block(p, k < n_truncated)}\n```" for k, p in enumerate(peers)]
    outro = PEERS_OUTRO.format(question=tasks.render_question(question))
    return "\n\n".join([*_guided([PEERS_INTRO, *blocks, outro], guidance), _instructions(question)])


def multiturn_messages(
    question: Question,
    exchanges: Sequence[Exchange],
    n_truncated: int = 0,
    own_truncated: bool = False,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[ChatMessage]:
    """Prompt for round r = len(exchanges) >= 1 in the multi-turn layout.

    On overflow the first `n_truncated` peer blocks lose their reasoning, counted from the oldest exchange,
    and `own_truncated` replaces the agent's earlier answers by their conclusion and final answer. Either cut
    changes the prefix the server has cached, so it is only made when the prompt would not fit.
    """
    messages = round0_messages(question, system_prompt)
    cut_left = n_truncated
    for ex in exchanges:
        own = _answer_block(ex.own, True) if own_truncated else ex.own_text
        n_cut = min(cut_left, len(ex.peers))
        cut_left -= n_cut
        messages.append(ChatMessage("assistant", own))
        messages.append(ChatMessage("user", peers_turn(question, ex.peers, n_cut, ex.guidance)))
    return messages
