"""The `synthetic` task: generated numeric questions for the synthetic debater backend (`sim`).

Each question's text starts with a machine-readable header line that the sim backend (dear/sim/) reads,
followed by a short fake word problem::

    [synthetic id=train-000017 difficulty=0.42 answer=731 distractors=118,402,655]
    A baker packs 37 crates with 19 loaves each and ...

gold = the answer. difficulty is uniform in [0.01, 0.99]; the distractors are the question's shared wrong
answers, most popular first. Questions are generated, not stored: question i of a split depends only on
(seed, split, i), so a larger n extends a smaller one, and the splits never share a question (ids carry the
split and the generators differ). These questions are labelled synthetic: task "synthetic", ids "train-…".
"""

from __future__ import annotations

import numpy as np

from dear.synthetic_header import SyntheticHeader, format_header, parse_header  # noqa: F401 (re-exported)
from dear.tasks.types import Question

TASK_NAME = "synthetic"
DEFAULT_N = {"train": 2000, "test": 500}
_SPLIT_CODE = {"train": 1, "test": 2}

_NAMES = ("A baker", "A farmer", "A librarian", "A courier", "A gardener", "A shopkeeper", "A teacher", "A pilot")
_THINGS = ("crates", "boxes", "baskets", "shelves", "trays", "bags", "rows", "carts")
_ITEMS = ("apples", "books", "letters", "seedlings", "loaves", "marbles", "tickets", "bottles")


def _question(split: str, i: int, seed: int) -> Question:
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_CODE[split], i]))
    answer = int(rng.integers(20, 1000))
    distractors: list[int] = []
    while len(distractors) < 3:
        # plausible slips: off by a step, a doubled or halved term, a digit error
        kind = rng.integers(4)
        if kind == 0:
            v = answer + int(rng.choice([-1, 1])) * int(rng.integers(1, 30))
        elif kind == 1:
            v = answer * 2
        elif kind == 2:
            v = answer // 2
        else:
            v = int(rng.integers(10, 1000))
        if v > 0 and v != answer and v not in distractors:
            distractors.append(v)
    difficulty = round(float(rng.uniform(0.01, 0.99)), 2)
    qid = f"{split}-{i:06d}"
    header = format_header(SyntheticHeader(qid, difficulty, str(answer), tuple(str(d) for d in distractors)))
    a, b = int(rng.integers(3, 60)), int(rng.integers(2, 30))
    body = (
        f"{_NAMES[rng.integers(len(_NAMES))]} fills {a} {_THINGS[rng.integers(len(_THINGS))]} with {b} "
        f"{_ITEMS[rng.integers(len(_ITEMS))]} each, then adds and removes a few more during the week. "
        "How many are there at the end?"
    )
    return Question(id=qid, task=TASK_NAME, question=f"{header}\n{body}", gold=str(answer), kind="numeric")


def load_synthetic(n: int | None = None, seed: int = 0, split: str = "train") -> list[Question]:
    """The first n synthetic questions of a split (default n: 2000 for train, 500 for test)."""
    if split not in DEFAULT_N:
        raise ValueError(f"synthetic task: unknown split {split!r}; choose one of {sorted(DEFAULT_N)}")
    if n is None:
        n = DEFAULT_N[split]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"synthetic task: n must be a non-negative int, got {n!r}")
    return [_question(split, i, seed) for i in range(n)]
