"""The sim's own texts: pseudo-words derived from the answer, the question and the agent (module docstring of
`dear.sim`, "Text"), and the stable keys every part of the simulator hashes."""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import Any

import numpy as np

from dear.synthetic_header import SyntheticHeader

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "fi", "he", "ja", "qu")


def _make_vocab(n: int = 1024) -> tuple[str, ...]:
    """n distinct 3-syllable pseudo-words, in a fixed order."""
    words = []
    for i in range(n):  # 3-syllable pseudo-words: distinct, deterministic, no real-language prior
        a, b, c = i % 16, (i // 16) % 16, (i // 256) % 16
        words.append(_SYLLABLES[a] + _SYLLABLES[b] + _SYLLABLES[c])
    return tuple(words)


VOCAB = _make_vocab()
PSEUDO_WORD_CHARS = 7  # a pseudo-word (3 syllables of 2 letters) and its space
TEXT_OVERHEAD_TOKENS = 18  # tokens of a completion outside its reasoning body (section headers, conclusion, answer)
NOISE = VOCAB[768:]  # noise words: disjoint from answer / topic words so noise does not fake agreement


def stable_int(*parts: Any) -> int:
    """A 64-bit hash of the parts' repr, the same in every process (Python's hash() is salted)."""
    h = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little")


@lru_cache(maxsize=65536)
def words_for(kind: str, key: str, n: int) -> tuple[str, ...]:
    """A deterministic word list for an answer / question / agent (independent of any seed)."""
    rng = np.random.default_rng(stable_int("sim-vocab", kind, key))
    return tuple(VOCAB[i] for i in rng.choice(768, size=n, replace=False))


def canon_answer(key: Any) -> str | None:
    """Answer keys as the engine normalises them ('731', '731.0', '1,000') → a canonical integer string."""
    if key is None:
        return None
    s = str(key).strip().replace(",", "")
    if not s:
        return None
    try:
        f = float(s)
    except ValueError:
        return s
    return str(int(f)) if math.isfinite(f) and f == int(f) else s


def body_words(rng: np.random.Generator, h: SyntheticHeader, answer_words: tuple[str, ...], agent: int,
               temp: float, n: int) -> list[str]:
    """n reasoning words: from the answer's vocabulary, the question's topic, the agent's style, or sampling
    noise (more of it at higher T), so texts with the same answer share most of their words."""
    topic_words = words_for("question", h.id, 12)
    style_words = words_for("agent", str(agent), 8)
    p_noise = min(0.4, 0.05 + 0.12 * temp)
    probs = np.array([0.80 - p_noise, 0.12, 0.05, 0.03 + p_noise])
    probs /= probs.sum()
    src = rng.choice(4, size=n, p=probs)
    picks = rng.integers(0, 1 << 30, size=n)
    pools = (answer_words, topic_words, style_words, NOISE)
    sizes = np.array([len(pl) for pl in pools])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pool = answer_words + topic_words + style_words + NOISE
    return [pool[i] for i in (offsets[src] + picks % sizes[src]).tolist()]
