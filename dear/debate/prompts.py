"""Debate prompts and the parser for structured answers (Reasoning / Conclusion / Final answer).

Round 0: the question plus the task's format instruction. Exchange rounds come in two layouts:

- `multiturn` (Du et al.'s multi-agent debate format): each agent's conversation grows. Its own previous
  answers are assistant turns, verbatim, and the peers' answers arrive as the next user turn ("These are the
  answers to the problem from other agents: ... Using the other agents' answers as additional information, can
  you provide your answer to the problem?"). Everything before the new user turn is the prompt of the agent's
  previous call plus its own answer, so a server that keeps the agent on one KV-cache slot reads only the new turn.
- `single`: one fresh user message per round holding the question, the agent's own previous answer and the
  selected peers' answers (labelled "Agent j", 1-based), then the instruction to reconsider.

Reply styles (`STYLES`, an agent profile's `style`, dear/debate/profiles.py): `cot` (the default, the paper's
agents) asks for reasoning, a conclusion and the final answer; `direct` asks for the "Final answer:" line alone,
without reasoning, and gives only the answer's form of the task's format instruction; `pot` (program of thought,
dear/debate/pot.py) asks for a Python program that prints the answer, with what to print per answer kind in place
of the task's format instruction (`ReplyStyle.forms`); the engine runs the program in the sandbox and reads its
printed line, so `extract` is not a `pot` turn's parser. An agent keeps its style in every turn: its round-0
prompt, its fresh samples and the format block ending its exchange turns.

Peers' answers are re-rendered from their parsed parts so that their reasoning can be cut when the prompt would
overflow the context window while their conclusion and final answer stay. A peer answer a moderator demoted is
shown as its one-line summary plus its final answer. An optional per-agent `guidance` (an intervention's advice
or agenda instruction) goes into the exchange user turn just before the format instruction, in both layouts.

Parsing: a turn's answer (`extract`) is the agent's own. Small models often repeat their prompt — the peers'
quoted answers, the question, the format instructions — before or after their own answer, so `own_text` first
cuts that material out (labelled peer blocks, fenced answer blocks, word-for-word prompt text, an unclosed fence
at the end of a truncated completion) and the task extractor reads what is left; the format instruction's
example phrase is never an answer, and a letter must name one of the question's options.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from dear import tasks
from dear.debate import pot
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

# The "direct" reply style: the final answer line alone, no reasoning (a cheaper, weaker agent than "cot").
DIRECT_STRUCTURE = (
    "Reply with your final answer only, without any reasoning or explanation, in exactly this format:\n"
    "Final answer: <your final answer in the required form>"
)
RECONSIDER_DIRECT = "Use the other agents' answers as additional information, then give your updated answer."
RECONSIDER_ALONE_DIRECT = "Check your previous answer, then give your updated answer."

LAYOUTS = ("multiturn", "single")


@dataclass(frozen=True)
class ReplyStyle:
    """How an agent is asked to reply (an agent profile's `style`): the format block that ends each of its user
    turns, and the single layout's request to reconsider. The multi-turn layout's peer turn is Du et al.'s
    wording in every style."""

    structure: str  # the reply format
    reasoning: bool  # True: the task's format instruction whole (it asks for step-by-step work); False: its answer form
    reconsider: str  # single layout, with peers
    reconsider_alone: str  # single layout, reading nobody
    # Per answer kind, the line that replaces the task's format instruction (`pot`: what the program prints);
    # None = the task's own (whole or its answer form, by `reasoning`).
    forms: Mapping[str, str] | None = None

    def __post_init__(self):
        if self.forms is not None:
            object.__setattr__(self, "forms", MappingProxyType(dict(self.forms)))

    def form(self, question: Question) -> str:
        """The line after the reply format: the style's own form for the question's kind, else the task's."""
        if self.forms is not None:
            if question.kind not in self.forms:
                raise ValueError(f"this reply style has no form for answer kind {question.kind!r}; it has "
                                 f"{', '.join(self.forms)}")
            return self.forms[question.kind]
        return tasks.format_instruction(question.kind) if self.reasoning else tasks.answer_form(question.kind)

    def instructions(self, question: Question) -> str:
        return f"{self.structure}\n{self.form(question)}"

    def prompt_texts(self, question: Question) -> list[str]:
        """This style's own prompt text that a completion may repeat (see `own_text`)."""
        return [self.structure, *self.structure.splitlines(), self.form(question), self.reconsider,
                self.reconsider_alone]


# "cot" is the paper's agent (reasoning, conclusion, final answer), the default everywhere.
STYLES: dict[str, ReplyStyle] = {
    "cot": ReplyStyle(STRUCTURE, True, RECONSIDER, RECONSIDER_ALONE),
    "direct": ReplyStyle(DIRECT_STRUCTURE, False, RECONSIDER_DIRECT, RECONSIDER_ALONE_DIRECT),
    # program of thought: a program that prints the answer, run in the sandbox (dear/debate/pot.py)
    pot.STYLE: ReplyStyle(pot.POT_STRUCTURE, False, pot.RECONSIDER_POT, pot.RECONSIDER_ALONE_POT,
                          forms=pot.PRINT_FORMS),
}
DEFAULT_STYLE = "cot"


def reply_style(name: str) -> ReplyStyle:
    """The reply style called `name` (STYLES); ValueError naming the valid ones otherwise."""
    try:
        return STYLES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reply style {name!r}; valid: {', '.join(STYLES)}") from None


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


# ---------------------------------------------------------------- the agent's own part of a completion
# A line that introduces a quoted peer answer: the multi-turn layout's "One agent's answer:" (and the variants a
# model writes when it repeats it: "The other agent's answer:", "Agent 1's response:"), the single layout's
# "Agent 2:", and the intros of either layout.
_PEER_LABEL = re.compile(
    r"[ \t>*#_-]*(?:(?:one|another|the\s+other|other)\s+agent['’]?s\s+(?:answer|response|reply|solution)"
    r"|agent\s+\d+(?:['’]s\s+(?:answer|response|reply|solution))?"
    r"|answers\s+from\s+(?:the\s+)?other\s+agents"
    r"|these\s+are\s+the\s+answers\s+to\s+the\s+problem\s+from\s+other\s+agents)[ \t*_]*[:：][ \t*_]*",
    re.IGNORECASE,
)
_FENCE = re.compile(r"[ \t]*```[ \t]*([^\s`]*)")
_SUMMARY = re.compile(r"[ \t>*#_-]*summary\b", re.IGNORECASE)
_BOX_MARK = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_MIN_ECHO_TOKENS = 4  # a cut-off echo at the end of a completion is dropped from this many words of prompt text on


def _is_final_line(line: str) -> bool:
    m = _HEADER.match(line)
    return m is not None and m.group(1).lower() == "final answer"


def _is_block_start(line: str) -> bool:
    """A line that opens a rendered answer block: a section header or a moderator's summary."""
    return _HEADER.match(line) is not None or _SUMMARY.match(line) is not None


def _next_nonblank(lines: list[str], i: int) -> int | None:
    for j in range(i, len(lines)):
        if lines[j].strip():
            return j
    return None


def _next_fence(lines: list[str], i: int) -> int | None:
    for j in range(i, len(lines)):
        if _FENCE.match(lines[j]):
            return j
    return None


def _block_end(lines: list[str], i: int) -> int:
    """End (exclusive) of an unfenced answer block starting at line i: after its first "Final answer:" line (and
    the next non-blank line when that header's line is empty), else at the next peer label or the end."""
    for j in range(i, len(lines)):
        if j > i and _PEER_LABEL.match(lines[j]):
            return j
        if _is_final_line(lines[j]):
            if _HEADER.match(lines[j]).end() >= len(lines[j].rstrip()):  # "Final answer:" alone on its line
                k = _next_nonblank(lines, j + 1)
                return j + 1 if k is None else k + 1
            return j + 1
    return len(lines)


def _quoted_section_end(lines: list[str], i: int, label_end: int) -> int:
    """End (exclusive) of the quoted peer answer whose label is line i."""
    rest = lines[i][label_end:].strip()
    if rest:  # "Agent 2: Reasoning: ..." or "One agent's answer: 160" on the label's line
        return _block_end(lines, i) if _is_block_start(rest) and not _is_final_line(rest) else i + 1
    j = _next_nonblank(lines, i + 1)
    if j is None:
        return len(lines)
    if _FENCE.match(lines[j]):
        close = _next_fence(lines, j + 1)
        return len(lines) if close is None else close + 1
    if _PEER_LABEL.match(lines[j]):  # an intro ("Answers from other agents:") before the labelled answers
        return j
    if _is_block_start(lines[j]):
        return _block_end(lines, j)
    k = j
    while k < len(lines) and lines[k].strip():  # a plain quoted paragraph
        k += 1
    return k


def _drop_quoted(text: str, truncated: bool) -> str:
    """`text` without quoted peer answers and fenced answer blocks (see `own_text`)."""
    lines = text.splitlines(keepends=True)
    keep = [True] * len(lines)
    last_kept: int | None = None  # last non-blank line kept so far
    i = 0
    while i < len(lines):
        label = _PEER_LABEL.match(lines[i])
        if label:
            end = _quoted_section_end(lines, i, label.end())
            keep[i:end] = [False] * (end - i)
            i = end
            continue
        fence = _FENCE.match(lines[i])
        if fence:
            lang = fence.group(1)
            nxt = _next_nonblank(lines, i + 1)
            if (not lang and last_kept is not None and _is_final_line(lines[last_kept])
                    and (nxt is None or not _is_block_start(lines[nxt]))):
                keep[i] = False  # the closing fence of the agent's own answer, written in the peers' block format
                i += 1
                continue
            close = _next_fence(lines, i + 1)
            if close is None:  # unclosed: cut at the token limit inside it, or the model just stopped
                if truncated:
                    keep[i:] = [False] * (len(lines) - i)
                    break
                keep[i] = False
                i += 1
                continue
            body = "".join(lines[i + 1 : close])
            if not lang and (any(_is_block_start(ln) for ln in lines[i + 1 : close]) or _BOX_MARK.search(body)):
                keep[i : close + 1] = [False] * (close + 1 - i)  # a quoted answer block
            else:
                last_kept = close  # code or its output: the agent's own work
            i = close + 1
            continue
        if lines[i].strip():
            last_kept = i
        i += 1
    return "".join(ln for ln, k in zip(lines, keep) if k)


@lru_cache(maxsize=512)
def _echo_pattern(s: str) -> re.Pattern[str]:
    """`s` word for word with any whitespace between its words."""
    return re.compile(r"\s+".join(re.escape(w) for w in s.split()))


def _prompt_texts(question: Question, style: str = DEFAULT_STYLE) -> list[str]:
    """Text of the prompts an agent of this reply style is shown that a completion may repeat, longest first."""
    outro_head = PEERS_OUTRO.split("\n", 1)[0]
    texts = [
        tasks.render_question(question), question.question, *reply_style(style).prompt_texts(question),
        PEERS_INTRO, outro_head, "The original problem is:", ALONE, SYSTEM_PROMPT,
    ]
    if question.kind == "choice" and question.choices:
        texts.append(tasks.render_question(question)[len(question.question):])  # the options list alone
    texts = {t.strip() for t in texts if len(t.split()) >= 2}
    return sorted(texts, key=len, reverse=True)


def _drop_prompt_echo(text: str, question: Question, style: str = DEFAULT_STYLE) -> str:
    """`text` without repeated prompt text: complete repeats anywhere, and one cut off at the end of the text."""
    texts = _prompt_texts(question, style)
    for t in texts:
        text = _echo_pattern(t).sub("\n", text)
    for t in texts:
        words = t.split()
        if len(words) <= _MIN_ECHO_TOKENS:
            continue
        starts = list(_echo_pattern(" ".join(words[:_MIN_ECHO_TOKENS])).finditer(text))
        if not starts:
            continue
        last = starts[-1]
        tail = text[last.start() :].split()
        n = len(tail)
        if n < len(words) and tail[:-1] == words[: n - 1] and words[n - 1].startswith(tail[-1]):
            text = text[: last.start()]  # the text ends inside a repeat of `t`
    return text


def own_text(text: str, question: Question, truncated: bool = False, style: str = DEFAULT_STYLE) -> str:
    """The agent's own part of a completion: `text` without the material it repeated from its prompt.

    Removed: quoted peer answers — a line labelled "One agent's answer:", "The other agent's answer:", "Agent 2:",
    "Answers from other agents:" or "These are the answers to the problem from other agents:" with what follows it
    (its fenced block, else its answer block up to its "Final answer:" line, else its paragraph); a fenced block
    holding an answer (a section header or a box; fenced code and its output stay); at the end of a completion cut
    at the token limit, a fence that was never closed and all after it; and prompt text repeated word for word
    (the question, its options, the format instructions, the layouts' fixed sentences), also when the cut fell
    inside it. A bare fence right after the agent's own "Final answer:" line closes that answer (models copy the
    peers' block format) and is dropped alone. The format instruction's example phrase ("for example \\boxed{B}")
    is left to `tasks.extract_answer`, which never reads it as an answer. `style` names the reply style the agent
    was prompted in (STYLES), whose format text it may repeat.
    """
    return _drop_prompt_echo(_drop_quoted(text or "", truncated), question, style)


def extract(text: str, question: Question, truncated: bool = False, style: str = DEFAULT_STYLE) -> str | None:
    """The agent's own answer: the task extractor applied to `own_text` — its "Final answer:" section first, then
    the whole own text (the last box wins there). None when the agent only repeated others' answers or the
    prompt, or when its final letter names no option of the question.

    ``truncated`` (the completion was cut at the token limit): only a marked answer counts — a complete
    `\\boxed{}` or an answer phrase ("Final answer:", "The answer is", "####"); otherwise there is no answer,
    rather than the last number or formula line of unfinished reasoning. `style`: the agent's reply style (STYLES).
    """
    own = own_text(text, question, truncated, style)
    if truncated:
        return tasks.extract_answer(own, question.kind, question.choices, marked_only=True)
    parsed = parse_sections(own)
    if parsed.final:
        ans = tasks.extract_answer(parsed.final, question.kind, question.choices)
        if ans is not None:
            return ans
        if question.kind == "choice" and tasks.extract_answer(parsed.final, "choice") is not None:
            return None  # a definite letter that is no option: not an earlier letter of the reasoning either
    return tasks.extract_answer(own, question.kind, question.choices)


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


def _instructions(question: Question, style: str = DEFAULT_STYLE) -> str:
    return reply_style(style).instructions(question)


def _guided(parts: list[str], guidance: str | None) -> list[str]:
    """`parts` with the guidance appended (blank guidance adds nothing)."""
    return [*parts, guidance.strip()] if guidance and guidance.strip() else parts


def round0_messages(question: Question, system_prompt: str = SYSTEM_PROMPT,
                    style: str = DEFAULT_STYLE) -> list[ChatMessage]:
    """The independent first answer's prompt (round 0, and a fresh sample), in the agent's reply style."""
    user = f"Question:\n{tasks.render_question(question)}\n\n{_instructions(question, style)}"
    return [ChatMessage("system", system_prompt), ChatMessage("user", user)]


def exchange_messages(
    question: Question,
    own: ShownAnswer,
    peers: Sequence[ShownAnswer],
    n_truncated: int = 0,
    own_truncated: bool = False,
    system_prompt: str = SYSTEM_PROMPT,
    guidance: str | None = None,
    style: str = DEFAULT_STYLE,
) -> list[ChatMessage]:
    """Prompt for round r >= 1. The first `n_truncated` peer blocks lose their reasoning (context overflow);
    `guidance` is inserted before the format instruction; `style` is the agent's reply style (STYLES)."""
    reply = reply_style(style)
    parts = [
        f"Question:\n{tasks.render_question(question)}",
        f"Your previous answer:\n{_answer_block(own, own_truncated)}",
    ]
    if peers:
        blocks = [
            f"Agent {p.agent + 1}:\n{_answer_block(p, k < n_truncated)}" for k, p in enumerate(peers)
        ]
        parts.append("Answers from other agents:\n\n" + "\n\n".join(blocks))
        parts.append(reply.reconsider)
    else:
        parts.append(reply.reconsider_alone)
    parts = _guided(parts, guidance)
    parts.append(reply.instructions(question))
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
               guidance: str | None = None, style: str = DEFAULT_STYLE) -> str:
    """The user turn that brings the peers' answers (or, with no peer, the request to double-check);
    `guidance` is inserted before the format instruction of the agent's reply `style`."""
    if not peers:
        return "\n\n".join([*_guided([ALONE], guidance), _instructions(question, style)])
    blocks = [f"One agent's answer:\n```\n{_answer_block(p, k < n_truncated)}\n```" for k, p in enumerate(peers)]
    outro = PEERS_OUTRO.format(question=tasks.render_question(question))
    return "\n\n".join([*_guided([PEERS_INTRO, *blocks, outro], guidance), _instructions(question, style)])


def multiturn_messages(
    question: Question,
    exchanges: Sequence[Exchange],
    n_truncated: int = 0,
    own_truncated: bool = False,
    system_prompt: str = SYSTEM_PROMPT,
    style: str = DEFAULT_STYLE,
) -> list[ChatMessage]:
    """Prompt for round r = len(exchanges) >= 1 in the multi-turn layout, in the agent's reply `style`.

    On overflow the first `n_truncated` peer blocks lose their reasoning, counted from the oldest exchange,
    and `own_truncated` replaces the agent's earlier answers by their conclusion and final answer. Either cut
    changes the prefix the server has cached, so it is only made when the prompt would not fit.
    """
    messages = round0_messages(question, system_prompt, style)
    cut_left = n_truncated
    for ex in exchanges:
        own = _answer_block(ex.own, True) if own_truncated else ex.own_text
        n_cut = min(cut_left, len(ex.peers))
        cut_left -= n_cut
        messages.append(ChatMessage("assistant", own))
        messages.append(ChatMessage("user", peers_turn(question, ex.peers, n_cut, ex.guidance, style)))
    return messages
