"""The answer-format instruction of each answer kind (stated once, used by every method) and question rendering.

Each instruction ends with an example ("for example \\boxed{42}"); a completion that echoes that phrase has not
answered with it (`dear.tasks.extract` drops the phrase before it looks for an answer)."""

from __future__ import annotations

from dear.tasks.extract import FORMAT_EXAMPLES, KINDS
from dear.tasks.types import AnswerKind, Question

# Each instruction is a lead that asks for reasoning, then the answer form (`answer_form`, alone in prompts that ask
# for the answer without reasoning).
_LEADS: dict[str, str] = {
    "numeric": "Solve the problem step by step.",
    "integer": "Solve the problem step by step.",
    "math": "Solve the problem step by step.",
    "choice": "Think through the options step by step.",
}
_FORMS: dict[str, str] = {
    "numeric": "Give the final answer as a single number without units inside \\boxed{}, for example \\boxed{%s}.",
    "integer": "Give the final answer as a single integer inside \\boxed{}, for example \\boxed{%s}.",
    "math": (
        "Give the final answer in simplest exact form, written in LaTeX inside \\boxed{}, for example \\boxed{%s}."
    ),
    "choice": (
        "Give the final answer as the letter of the single correct option inside \\boxed{}, for example "
        "\\boxed{%s}."
    ),
}
# The example is stated once (dear.tasks.extract.FORMAT_EXAMPLES): extraction ignores it inside this phrase.
_ANSWER_FORMS: dict[str, str] = {kind: text % FORMAT_EXAMPLES[kind] for kind, text in _FORMS.items()}
_INSTRUCTIONS: dict[str, str] = {kind: f"{_LEADS[kind]} {_ANSWER_FORMS[kind]}" for kind in _FORMS}


def format_instruction(kind: AnswerKind) -> str:
    """The one answer-format instruction for questions of this kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    return _INSTRUCTIONS[kind]


def answer_form(kind: AnswerKind) -> str:
    """The format instruction without its lead that asks for step-by-step reasoning: only the answer's form and
    its example (for prompts that ask for the answer alone)."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    return _ANSWER_FORMS[kind]


def format_example(kind: AnswerKind) -> str:
    """The example answer the kind's format instruction shows inside its "for example \\boxed{...}" phrase."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    return FORMAT_EXAMPLES[kind]


def option_letters(n: int) -> list[str]:
    return [chr(65 + i) for i in range(n)]


def render_question(q: Question) -> str:
    """The question text; for multiple choice followed by its options as `A) ...` lines."""
    if q.kind != "choice" or not q.choices:
        return q.question
    options = "\n".join(
        f"{letter}) {text}" for letter, text in zip(option_letters(len(q.choices)), q.choices)
    )
    return f"{q.question}\n\nOptions:\n{options}"
