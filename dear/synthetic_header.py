"""The header that tags a synthetic question: written by the task (dear.tasks.synthetic), read by the simulator
(dear.sim) and the server. One format, one parser, on floor 0 so that both floor-1 packages share it."""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER_FORMAT = "[synthetic id={id} difficulty={difficulty:.2f} answer={answer} distractors={distractors}]"
HEADER_RE = re.compile(
    r"\[synthetic id=(?P<id>[^\s\]]+) difficulty=(?P<difficulty>[0-9]*\.?[0-9]+) "
    r"answer=(?P<answer>-?\d+) distractors=(?P<distractors>-?\d+(?:,-?\d+)*)\]"
)


@dataclass(frozen=True)
class SyntheticHeader:
    id: str
    difficulty: float  # in (0, 1); higher is harder
    answer: str  # the gold integer, as text
    distractors: tuple[str, ...]  # the shared wrong answers, most popular first


def format_header(h: SyntheticHeader) -> str:
    return HEADER_FORMAT.format(
        id=h.id, difficulty=h.difficulty, answer=h.answer, distractors=",".join(h.distractors)
    )


def parse_header(text: str) -> SyntheticHeader | None:
    """The header of a synthetic question found anywhere in `text` (first match), or None."""
    m = HEADER_RE.search(text or "")
    if m is None:
        return None
    return SyntheticHeader(id=m["id"], difficulty=float(m["difficulty"]), answer=m["answer"],
                           distractors=tuple(m["distractors"].split(",")))
