"""Typed records shared by loaders, prompts, extraction and grading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# numeric: GSM8K-style number (float tolerance); integer: AIME 0-999; math: LaTeX (math-verify);
# choice: a letter A.. for multiple choice.
AnswerKind = Literal["numeric", "integer", "math", "choice"]


@dataclass(frozen=True)
class Question:
    id: str
    task: str
    question: str
    gold: str  # the gold answer; for `choice` the correct letter
    kind: AnswerKind
    choices: tuple[str, ...] | None = None  # option texts in letter order (A, B, ...)


@dataclass(frozen=True)
class GradeResult:
    correct: bool
    grader: str  # which grader decided, e.g. "numeric", "integer", "choice", "math-verify", "sympy", "none"
    pred: str | None  # the normalised prediction that was compared
