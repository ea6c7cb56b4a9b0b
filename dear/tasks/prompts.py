"""The answer-format instruction of each answer kind (stated once, used by every method) and question rendering.

Each instruction ends with an example ("for example \\boxed{42}"); a completion that echoes that phrase has not
answered with it (`dear.tasks.extract` drops the phrase before it looks for an answer)."""

from __future__ import annotations

from dear.tasks.extract import FORMAT_EXAMPLES, KINDS
from dear.tasks.types import AnswerKind, Question

_TEMPLATES: dict[str, str] = {
    "numeric": (
        "Solve the problem step by step. Give the final answer as a single number without units inside "
        "\\boxed{}, for example \\boxed{%s}."
    ),
    "integer": (
        "Solve the problem step by step. Give the final answer as a single integer inside \\boxed{}, "
        "for example \\boxed{%s}."
    ),
    "math": (
        "Solve the problem step by step. Give the final answer in simplest exact form, written in LaTeX inside "
        "\\boxed{}, for example \\boxed{%s}."
    ),
    "choice": (
        "Think through the options step by step. Give the final answer as the letter of the single correct option "
        "inside \\boxed{}, for example \\boxed{%s}."
    ),
}
# The example is stated once (dear.tasks.extract.FORMAT_EXAMPLES): extraction ignores it inside this phrase.
_INSTRUCTIONS: dict[str, str] = {kind: text % FORMAT_EXAMPLES[kind] for kind, text in _TEMPLATES.items()}


def format_instruction(kind: AnswerKind) -> str:
    """The one answer-format instruction for questions of this kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    return _INSTRUCTIONS[kind]


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
