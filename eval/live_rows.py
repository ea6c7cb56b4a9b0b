"""Live methods' results per question, read from `eval.run` results directories, to pair with bank replays.

A method that revises (MAD, MAD-stop, the paper's DEAR, a DEAR whose turns read peers) or is regulated by a policy
cannot be replayed from independent samples: `eval.run` ran it live. Its traces (`traces/<benchmark>/<method>.jsonl`)
give each question's final score (a failed debate scores 0, a tie its expected value) and tokens (prompt +
completion of every call, round 0 included: the report's `total_tokens`); its label is the report's (`summary.csv`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dear.debate.methods import METHODS

LIVE_KINDS = ("debate", "dear")  # method kinds a bank cannot replay (dear.debate.methods.MethodSpec.kind)


@dataclass(frozen=True)
class LiveMethod:
    """One method of one `eval.run` directory on one benchmark: per-question final scores and tokens."""

    method: str
    label: str
    source: Path
    benchmark: str
    scores: dict[str, float]
    tokens: dict[str, float]

    def on(self, questions: Sequence[str]) -> tuple[list[float], list[float]]:
        """Scores and tokens on `questions` (each must be one this method debated)."""
        return [self.scores[q] for q in questions], [self.tokens[q] for q in questions]

    def mean_on(self, questions: Sequence[str]) -> tuple[float, float]:
        scores, tokens = self.on(questions)
        return float(np.mean(scores)), float(np.mean(tokens))


def live_methods_of(directory: Path, methods: Sequence[str] | None = None) -> list[LiveMethod]:
    """The live methods of an `eval.run` results directory (default: every method of a kind in `LIVE_KINDS` that
    has traces), per benchmark; ValueError naming the file for a missing report or a damaged trace line."""
    report = directory / "summary.csv"
    if not report.is_file():
        raise ValueError(f"{report}: not found (give eval.run results directories to --live)")
    with report.open(encoding="utf-8", newline="") as fh:
        labels = {(r["benchmark"], r["method"]): r["label"] for r in csv.DictReader(fh)}
    out = []
    for (benchmark, method), label in labels.items():
        wanted = method in methods if methods else (method in METHODS and METHODS[method].kind in LIVE_KINDS)
        path = directory / "traces" / benchmark / f"{method}.jsonl"
        if wanted and path.is_file():
            out.append(_read(path, method, label, directory, benchmark))
    return out


def _read(path: Path, method: str, label: str, directory: Path, benchmark: str) -> LiveMethod:
    scores: dict[str, float] = {}
    tokens: dict[str, float] = {}
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                t = json.loads(line)
                q = str(t["question_id"])
                scores[q] = 0.0 if t.get("failed") else float(t.get("final_score") or 0.0)
                tokens[q] = float(t["prompt_tokens"]) + float(t["completion_tokens"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{line_no}: not a debate trace ({exc})") from None
    return LiveMethod(method, label, directory, benchmark, scores, tokens)
