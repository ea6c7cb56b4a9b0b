"""Benchmark data, answer-format instructions, answer extraction and graders (see docs/ARCHITECTURE.md).

>>> from dear.tasks import load, extract_answer, grade
>>> qs = load("gsm8k", n=50, seed=0)
>>> grade(extract_answer("... so she makes \\boxed{18} dollars.", "numeric"), load("gsm8k")[0])
GradeResult(correct=True, grader='numeric', pred='18')
"""

from dear.tasks.extract import KINDS, extract_answer, normalize_answer
from dear.tasks.grade import grade
from dear.tasks.loaders import (
    TASK_ALIASES,
    TASKS,
    TaskSpec,
    canonical_task,
    get_task,
    held_out,
    known_tasks_hint,
    load,
    load_jsonl,
    subset,
    task_names,
)
from dear.tasks.prompts import answer_form, format_instruction, render_question
from dear.tasks.types import AnswerKind, GradeResult, Question

__all__ = [
    "KINDS",
    "TASKS",
    "TASK_ALIASES",
    "canonical_task",
    "known_tasks_hint",
    "AnswerKind",
    "GradeResult",
    "Question",
    "TaskSpec",
    "answer_form",
    "extract_answer",
    "format_instruction",
    "get_task",
    "grade",
    "held_out",
    "load",
    "load_jsonl",
    "normalize_answer",
    "render_question",
    "subset",
    "task_names",
]
