"""Real texts for the sim: a text bank built from a real debate corpus (module docstring of `dear.sim`, "Real
texts"), from which the backend takes a completion of the answer class that stands for its own answer."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from dear.sim.text import canon_answer, stable_int
from dear.synthetic_header import SyntheticHeader

_FINAL_RE = re.compile(r"(?is)(final answer\s*:.*)$")
_SENTENCE_OR_LINE = re.compile(r"(?<=[.!?])\s+|\n+")
_NUMBER = re.compile(r"(?<![\d.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d,]\d)")


class TextBank:
    """Real completions grouped by question and parsed answer (the `dear.sim` docstring, "Real texts")."""

    def __init__(self, questions: list[dict[str, Any]], source: str = "", rewrite_answers: bool = False):
        """`rewrite_answers` (a bank file's key of that name): the real answer of a text's class is rewritten to
        the sim's answer wherever the text states it, so that a text agrees in its numbers with the sim agents
        that give the same answer (an answer-only agent shows nothing else; banks written before it lack it)."""
        usable = [q for q in questions if q.get("classes")]
        if not usable:
            raise ValueError(f"text bank {source or ''} has no question with answer classes")
        for q in usable:
            for c in q["classes"]:
                if not c.get("texts"):
                    raise ValueError(f"text bank {source}: question {q.get('id')} answer {c.get('answer')} has no texts")
        self.questions = usable
        self.source = source
        self.rewrite_answers = bool(rewrite_answers)
        # Differing sim answers must land on differing real answers: prefer questions with a correct class and
        # at least two wrong classes (when there are enough of them) so wrong answers rarely share a class.
        diverse = [q for q in usable if any(c.get("correct") for c in q["classes"])
                   and sum(not c.get("correct") for c in q["classes"]) >= 2]
        self.eligible = diverse if len(diverse) >= 5 else usable
        self._pool: dict[str, list[str]] = {}

    @classmethod
    def load(cls, path: str | Path) -> TextBank:
        path = Path(path)
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError as e:
            raise ValueError(f"sim text bank not found: {path}") from e
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a gzip JSON text bank ({e})") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("questions"), list):
            raise ValueError(f"{path}: a text bank is {{'questions': [...]}}")
        return cls(doc["questions"], str(path), rewrite_answers=bool(doc.get("rewrite_answers", False)))

    @staticmethod
    def strip_final(text: str) -> str:
        """The completion without its final-answer section (the sim writes its own)."""
        return _FINAL_RE.sub("", text).rstrip() or text

    def text_for(self, h: SyntheticHeader, answer: str, round_: int, agent: int, keep: float = 1.0,
                 mix: float = 0.0) -> str:
        """A real completion (without its final answer) of the bank class that stands for the sim's `answer`;
        with keep < 1 or mix > 0 its sentences are recombined (the `dear.sim` docstring, "Real texts")."""
        q = self.eligible[stable_int("bank-question", h.id) % len(self.eligible)]
        classes = q["classes"]
        gold = [k for k, c in enumerate(classes) if c.get("correct")]
        wrong = [k for k, c in enumerate(classes) if not c.get("correct")] or list(range(len(classes)))
        if answer == canon_answer(h.answer):
            k = gold[0] if gold else 0
        elif answer in (h.distractors or ()):
            k = wrong[list(h.distractors).index(answer) % len(wrong)]
        else:
            k = wrong[stable_int("bank-unique", answer) % len(wrong)]
        texts = classes[k]["texts"]
        pick = (stable_int("bank-text", h.id, round_, answer) + agent) % len(texts)
        text = self.strip_final(texts[pick])
        if self.rewrite_answers:
            text = rewrite_answer(text, str(classes[k].get("answer", "")), answer)
        if keep >= 1.0 and mix <= 0.0:
            return text
        # Seeded by the bank text, not the synthetic question: the many synthetic questions that share a bank
        # question show the same few recombinations, which the encoder's memo then embeds once.
        rng = np.random.default_rng(stable_int("bank-recombine", q["id"], k, pick, round_, agent))
        return self._recombine(text, self._sentences(q), keep, mix, rng)

    def _sentences(self, q: dict[str, Any]) -> list[str]:
        """Every sentence of the bank question's texts (all classes), the pool that `mix` draws from."""
        if q["id"] not in self._pool:
            self._pool[q["id"]] = [s for c in q["classes"] for t in c["texts"]
                                   for s in _split_sentences(self.strip_final(t))]
        return self._pool[q["id"]]

    @staticmethod
    def _recombine(text: str, pool: list[str], keep: float, mix: float, rng: np.random.Generator) -> str:
        """The text's sentences, each replaced by a pool sentence with probability `mix`, else kept with
        probability `keep`; the last one (the conclusion) always stays, so the answer's wording does."""
        sents = _split_sentences(text)
        if len(sents) < 2:
            return text
        out = []
        for s in sents[:-1]:
            if rng.random() < mix:
                out.append(pool[int(rng.integers(len(pool)))])
            elif rng.random() < keep:
                out.append(s)
        return "\n".join(out + sents[-1:])


def rewrite_answer(text: str, real: str, sim: str) -> str:
    """`text` with every statement of the number `real` (as written: `1200`, `1,200`, `1200.0`) replaced by `sim`;
    a non-numeric `real` is replaced where it occurs verbatim."""
    if not real:
        return text
    try:
        value = float(real.replace(",", ""))
    except ValueError:
        return text.replace(real, sim)

    def swap(m: re.Match) -> str:
        try:
            return sim if float(m.group(0).replace(",", "")) == value else m.group(0)
        except ValueError:
            return m.group(0)

    return _NUMBER.sub(swap, text)


def _split_sentences(text: str) -> list[str]:
    """The text's sentences and lines, stripped, empty ones dropped."""
    return [s.strip() for s in _SENTENCE_OR_LINE.split(text) if s.strip()]

