"""`sim`: a synthetic debater backend — a documented stochastic population model, no language model.

Everything it produces is labelled synthetic: ``model_id = "sim-v1"``, ``synthetic = True``, every log line
starts with ``[synthetic]``. It is for fast tests and algorithm checks (thousands of debates per minute on one
CPU core), never for reporting LLM results.

How it acts
-----------
It reads ``ChatRequest.metadata`` set by the debate engine (``agent``, ``round``, ``own_answer``,
``peer_answers``, ``question_text``), not the prompt. The question's facts come from a machine-readable
header on the first line of a ``synthetic`` task question (see ``dear/tasks/synthetic.py``)::

    [synthetic id=train-000017 difficulty=0.42 answer=731 distractors=118,402,655]

Notation: agent a has skill s_a (``skills[a % len(skills)]``, logits); the question has difficulty δ ∈ (0, 1)
from the header and difficulty logit d = c + k·logit(δ) (c = ``difficulty_center``, k = ``difficulty_scale``;
δ is uniform in the synthetic task, so d is logistic-distributed across questions). σ is the logistic
function. The sampling "excess" of a request with temperature T and top-p P is

    x = (T − T0) + w_p·(P − P0)                 (T0 = ``t_ref``, P0 = ``top_p_ref``, w_p = ``top_p_weight``)

so top-p below P0 acts like a slightly lower temperature (less randomness) and x = 0 at the reference.

Round 0 (and every "re-solve" below) is an independent draw; so is a fresh turn (``metadata["fresh"]``, an
independent sample from the question alone in a later round), without the re-solve bonus:

    P(correct) = σ(s_a − d − τ·x [+ β on a re-solve])          (τ = ``temp_penalty``, β = ``resolve_bonus``)

A wrong draw is the question's i-th distractor with probability (1 − u)·softmax(−λ·i) (λ =
``distractor_decay``: the first distractor is the popular mistake, so wrong majorities form), or with
probability u (``p_unique_wrong``) an idiosyncratic wrong number nobody else is likely to give.

Round r ≥ 1. Let n_agr / n_dis be how many of the peers shown in the prompt (``peer_answers``; peers without an
answer are ignored) share / do not share the agent's previous answer. The agent *moves* with probability

    reads nobody:   σ(s0 + s1·x)                                   (self-revision; s0 ≪ 0)
    reads peers:    σ(a0 + a1·n_dis − a2·n_agr + a3·x)             (conformity pressure)

If it moves and n_dis > 0 it adopts the plurality of the disagreeing peers' answers (ties broken at random:
blind conformity, the source of correct→incorrect flips of a correct minority), except that with probability
ρ (``p_resolve``) it instead re-solves (independent redraw, the source of incorrect→correct by
reconsideration). If it moves with n_dis = 0 (nobody or only agreeing peers read) it re-solves. An agent whose
previous answer was missing always re-solves. Otherwise it keeps its answer. Consequences by design:
reading only agreeing peers almost never moves an agent (σ(a0 − a2) ≈ 0.5 %), an isolated correct minority that
reads nobody keeps its answer with probability ≈ 1 − σ(s0)·(1 − P(correct)), and lower temperature lowers
every move probability (a3, s1 > 0) — so a regulator that prunes who-reads-whom and cools the sampling can
beat full-mesh MAD. Defaults reproduce, at T = 0.7 with a full mesh and 3 agents, the embedded model's GSM8K
numbers quoted in issue 5: round-0 accuracy ≈ 0.4, about a third of questions unanimous at round 0,
C→I ≈ 3/28 and I→C ≈ 10/44 over one exchange round (checked in tests/test_sim.py).

Text
----
"Reasoning: …\\nConclusion: The answer is X …\\nFinal answer: \\boxed{X}". The reasoning words come mostly
from a vocabulary derived deterministically from the answer X (stable hash), plus topic words of the question
(shared by everyone) and noise words from the agent's style and the sampling (more at higher T), so embeddings
of agents with the same answer are much closer than of agents with different answers. Length in words grows
with T (``words_base + words_per_temp·T``, ≈ 60–150). Token counters: prompt_tokens = characters of all messages
/ ``prompt_chars_per_token`` (4 by default); with ``text_chars_per_token`` = 0 (default) completion_tokens is the
word count, with c > 0 (the fit's value) a completion of n tokens is written about n·c characters long, so a sim
text counts in a later prompt what a real completion of its length counts. A completion longer than the request's ``max_tokens`` is cut there with
``finish_reason = "length"`` and loses its conclusion and final answer, as a real model's would.

Real texts (option ``text_bank``, issue 14): on real texts the encoder separates agreeing from differing pairs
far less than on the pseudo-words above (real MiniLM d′ ≈ 1 vs ≈ 14 here). With a text bank (a gzip JSON built
from a real debate corpus by ``python -m eval.evidence_match``: per real question, its distinct parsed answers,
each with the real completions that gave it), the decision and the token count stay the sim's, but the text is
a real completion: the synthetic question maps to one bank question (stable hash of its id), the sim's gold
answer to that question's correct answer class, the i-th distractor to its i-th wrong class, an idiosyncratic
answer to a wrong class by hash; the agent takes a text of that class (by stable hash, distinct agents get
distinct texts when the class has enough) and its final answer is rewritten to the sim's answer. So two agents
with equal sim answers show two real texts that gave the same answer to one question, and two agents with
different answers show real texts with different answers to one question: real agreeing / differing pairs.
A corpus of a few debates per question holds one or two texts for most classes, so whole texts would make two
agreeing agents show the identical text (e_ij = 1) far more often than real agents do. Hence the text is
recombined at the sentence level (sentences and lines): each reasoning sentence is replaced, with probability
``bank_sentence_mix``, by a random sentence of any text of the same bank question, else kept with probability
``bank_sentence_keep`` (the last sentence, the conclusion, always stays). Both are fitted by
``eval.evidence_match`` to the real e_ij distributions; 1 and 0 give the whole completion.

Randomness: one ``numpy.random.Generator`` per request, seeded by (backend seed, request seed, a stable hash
of question id / agent / round), so the same requests with the same seeds give bit-identical completions in any
batch order. Requests without a seed use a stable hash of their messages instead.

Fault injection
---------------
``SimBackend(fail_rate=p)`` (spec option ``llm.options.fail_rate``) makes each request fail with probability p,
the way a real backend reports a request it gave up on: a Completion with ``error`` set and
``finish_reason = "error"``. Whether a request fails is drawn from its own generator (same seeds as above, plus a
fixed tag), so failures are deterministic per request, independent of batch order, and the answers of the
requests that do not fail are unchanged. ``fail_rate=1`` is a dead backend.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dear.llm.base import Backend, ChatRequest, Completion
from dear.synthetic_header import SyntheticHeader, format_header, parse_header  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

SIM_MODEL_ID = "sim-v1"
_FAIL_TAG = 0xFA11  # separates the failure draw's seed from the answer draws' seed
LOG_PREFIX = "[synthetic]"

# ---------------------------------------------------------------- parameters
@dataclass
class SimParams:
    """All parameters of the population model (equations in the module docstring). JSON round-trips."""

    # round 0
    skills: list[float] = field(default_factory=lambda: [0.2, 0.0, -0.2])  # per agent, cycled for V agents
    difficulty_center: float = 0.6  # c
    difficulty_scale: float = 1.15  # k
    temp_penalty: float = 0.5  # τ: hotter sampling, fewer correct first answers
    t_ref: float = 0.7  # T0
    top_p_ref: float = 0.9  # P0
    top_p_weight: float = 0.5  # w_p
    distractor_decay: float = 1.5  # λ
    p_unique_wrong: float = 0.08  # u
    # rounds >= 1
    self_revise_bias: float = -3.5  # s0
    self_revise_temp: float = 1.5  # s1
    switch_bias: float = -2.2  # a0
    switch_disagree: float = 2.0  # a1
    switch_agree: float = 3.0  # a2
    switch_temp: float = 1.5  # a3
    p_resolve: float = 0.7  # ρ
    resolve_bonus: float = 1.8  # β
    # text
    words_base: float = 55.0
    words_per_temp: float = 70.0
    # token counting (the fit takes both from the corpus; the defaults are the stylised world's)
    prompt_chars_per_token: float = 4.0  # prompt_tokens = characters of all messages / this
    text_chars_per_token: float = 0.0  # 0: one pseudo-word per completion token; > 0: n tokens are n·c characters
    # bank texts (used only with a text bank; eval.evidence_match fits both): 1 and 0 = whole real completions
    bank_sentence_keep: float = 1.0  # each reasoning sentence of the bank text is kept with this probability
    bank_sentence_mix: float = 0.0  # ... or first replaced, with this one, by a sentence of the question's texts

    def __post_init__(self) -> None:
        if not isinstance(self.skills, (list, tuple)) or not self.skills:
            raise ValueError(f"SimParams.skills must be a non-empty list of floats, got {self.skills!r}")
        self.skills = [float(s) for s in self.skills]
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "skills":
                bad = [s for s in v if not math.isfinite(s)]
                if bad:
                    raise ValueError(f"SimParams.skills has non-finite values {bad}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"SimParams.{f.name} must be a finite number, got {v!r}")
            setattr(self, f.name, float(v))
        for name in ("p_unique_wrong", "p_resolve", "bank_sentence_keep", "bank_sentence_mix"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"SimParams.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("difficulty_scale", "words_base", "prompt_chars_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SimParams.{name} must be > 0, got {getattr(self, name)}")
        for name in ("words_per_temp", "text_chars_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"SimParams.{name} must be >= 0, got {getattr(self, name)}")

    def skill(self, agent: int) -> float:
        return self.skills[agent % len(self.skills)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SimParams:
        if not isinstance(d, dict):
            raise ValueError(f"SimParams.from_dict expects a dict, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"SimParams: unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**d)

    def to_json(self, path: str | Path, **extra: Any) -> None:
        """Write {"model_id", "synthetic", "params", **extra} to a file whose name must contain 'synthetic'."""
        path = Path(path)
        if "synthetic" not in path.name:
            raise ValueError(f"sim parameter files are labelled synthetic: put 'synthetic' in the name ({path})")
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"model_id": SIM_MODEL_ID, "synthetic": True, "params": self.to_dict(), **extra}
        path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, path: str | Path) -> SimParams:
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ValueError(f"sim parameter file not found: {path}") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from e
        if isinstance(doc, dict) and "params" in doc:
            doc = doc["params"]
        try:
            return cls.from_dict(doc)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e


# ---------------------------------------------------------------- the model's equations (shared with the fitter)
def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


def logit(p):
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def difficulty_logit(p: SimParams, difficulty):
    """d = c + k·logit(δ)."""
    return p.difficulty_center + p.difficulty_scale * logit(difficulty)


def excess(p: SimParams, temperature, top_p):
    """x = (T − T0) + w_p·(P − P0)."""
    return (np.asarray(temperature, dtype=np.float64) - p.t_ref) + p.top_p_weight * (
        np.asarray(top_p, dtype=np.float64) - p.top_p_ref
    )


def p_correct(p: SimParams, skill, d, x, resolve: bool = False):
    """P(an independent draw is correct) = σ(s − d − τ·x [+ β])."""
    return sigmoid(np.asarray(skill) - d - p.temp_penalty * x + (p.resolve_bonus if resolve else 0.0))


def p_move(p: SimParams, n_dis, n_agr, x):
    """P(the agent moves in round ≥ 1): self-revision if it reads nobody, else conformity pressure."""
    n_dis = np.asarray(n_dis, dtype=np.float64)
    n_agr = np.asarray(n_agr, dtype=np.float64)
    alone = p.self_revise_bias + p.self_revise_temp * x
    peers = p.switch_bias + p.switch_disagree * n_dis - p.switch_agree * n_agr + p.switch_temp * x
    return sigmoid(np.where(n_dis + n_agr > 0, peers, alone))


def distractor_weights(p: SimParams, n: int) -> np.ndarray:
    """P(wrong answer = distractor i | wrong, not idiosyncratic) = softmax(−λ·i)."""
    w = np.exp(-p.distractor_decay * np.arange(n, dtype=np.float64))
    return w / w.sum()


# ---------------------------------------------------------------- text
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "fi", "he", "ja", "qu")


def _make_vocab(n: int = 1024) -> tuple[str, ...]:
    words = []
    for i in range(n):  # 3-syllable pseudo-words: distinct, deterministic, no real-language prior
        a, b, c = i % 16, (i // 16) % 16, (i // 256) % 16
        words.append(_SYLLABLES[a] + _SYLLABLES[b] + _SYLLABLES[c])
    return tuple(words)


VOCAB = _make_vocab()
PSEUDO_WORD_CHARS = 7  # a pseudo-word (3 syllables of 2 letters) and its space
TEXT_OVERHEAD_TOKENS = 18  # tokens of a completion outside its reasoning body (section headers, conclusion, answer)
_NOISE = VOCAB[768:]  # noise words: disjoint from answer / topic words so noise does not fake agreement


def _stable_int(*parts: Any) -> int:
    h = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little")


@lru_cache(maxsize=65536)
def _words_for(kind: str, key: str, n: int) -> tuple[str, ...]:
    """A deterministic word list for an answer / question / agent (independent of any seed)."""
    rng = np.random.default_rng(_stable_int("sim-vocab", kind, key))
    return tuple(VOCAB[i] for i in rng.choice(768, size=n, replace=False))


def _canon(key: Any) -> str | None:
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


@lru_cache(maxsize=65536)
def _header_cached(text: str) -> SyntheticHeader | None:
    return parse_header(text)


def _agent_index(agent: Any) -> int:
    if isinstance(agent, (int, np.integer)):
        return int(agent)
    m = re.search(r"(\d+)$", str(agent))
    if m is None:
        raise ValueError(f"[synthetic] metadata['agent'] must be an int or end in digits, got {agent!r}")
    return int(m.group(1))


@dataclass(frozen=True)
class TurnDecision:
    """What the model decided for one request (kept for tests and the fitter)."""

    answer: str
    correct: bool
    moved: bool
    mode: str  # "round0" | "keep" | "adopt" | "resolve"


def meta_round(req: ChatRequest) -> int:
    return int((req.metadata or {}).get("round", 0) or 0)


_FINAL_RE = re.compile(r"(?is)(final answer\s*:.*)$")
_SENTENCE_OR_LINE = re.compile(r"(?<=[.!?])\s+|\n+")


class TextBank:
    """Real completions grouped by question and parsed answer (see the module docstring, "Real texts")."""

    def __init__(self, questions: list[dict[str, Any]], source: str = ""):
        usable = [q for q in questions if q.get("classes")]
        if not usable:
            raise ValueError(f"text bank {source or ''} has no question with answer classes")
        for q in usable:
            for c in q["classes"]:
                if not c.get("texts"):
                    raise ValueError(f"text bank {source}: question {q.get('id')} answer {c.get('answer')} has no texts")
        self.questions = usable
        self.source = source
        # Differing sim answers must land on differing real answers: prefer questions with a correct class and
        # at least two wrong classes (when there are enough of them) so wrong answers rarely share a class.
        diverse = [q for q in usable if any(c.get("correct") for c in q["classes"])
                   and sum(not c.get("correct") for c in q["classes"]) >= 2]
        self.eligible = diverse if len(diverse) >= 5 else usable
        self._pool: dict[str, list[str]] = {}

    @classmethod
    def load(cls, path: str | Path) -> TextBank:
        import gzip

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
        return cls(doc["questions"], str(path))

    @staticmethod
    def strip_final(text: str) -> str:
        """The completion without its final-answer section (the sim writes its own)."""
        return _FINAL_RE.sub("", text).rstrip() or text

    def text_for(self, h: SyntheticHeader, answer: str, round_: int, agent: int, keep: float = 1.0,
                 mix: float = 0.0) -> str:
        """A real completion (without its final answer) of the bank class that stands for the sim's `answer`;
        with keep < 1 or mix > 0 its sentences are recombined (see the module docstring, "Real texts")."""
        q = self.eligible[_stable_int("bank-question", h.id) % len(self.eligible)]
        classes = q["classes"]
        gold = [k for k, c in enumerate(classes) if c.get("correct")]
        wrong = [k for k, c in enumerate(classes) if not c.get("correct")] or list(range(len(classes)))
        if answer == _canon(h.answer):
            k = gold[0] if gold else 0
        elif answer in (h.distractors or ()):
            k = wrong[list(h.distractors).index(answer) % len(wrong)]
        else:
            k = wrong[_stable_int("bank-unique", answer) % len(wrong)]
        texts = classes[k]["texts"]
        pick = (_stable_int("bank-text", h.id, round_, answer) + agent) % len(texts)
        text = self.strip_final(texts[pick])
        if keep >= 1.0 and mix <= 0.0:
            return text
        # Seeded by the bank text, not the synthetic question: the many synthetic questions that share a bank
        # question show the same few recombinations, which the encoder's memo then embeds once.
        rng = np.random.default_rng(_stable_int("bank-recombine", q["id"], k, pick, round_, agent))
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


def _split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_OR_LINE.split(text) if s.strip()]


class SimBackend(Backend):
    """Synthetic debaters driven by `SimParams` (see the module docstring)."""

    model_id = SIM_MODEL_ID
    synthetic = True
    context_length = 32768

    def __init__(self, params: SimParams | dict | str | Path | None = None, seed: int = 0, fail_rate: float = 0.0,
                 params_file: str | Path | None = None, text_bank: str | Path | None = None):
        """`params_file` (e.g. `llm.options.params_file` in a train config): a SimParams JSON such as the fit
        written by `python -m eval.fit_corpus`; `params` given with it must be a dict of overrides."""
        if params_file is not None:
            if not isinstance(params_file, (str, Path)) or not str(params_file).strip():
                raise ValueError(f"SimBackend params_file must be a path, got {params_file!r}")
            if params is not None and not isinstance(params, dict):
                raise ValueError("SimBackend: with params_file, params may only be a dict of overrides")
            base = SimParams.from_json(params_file).to_dict()
            params = SimParams.from_dict({**base, **(params or {})})
        if params is None:
            params = SimParams()
        elif isinstance(params, dict):
            params = SimParams.from_dict(params)
        elif isinstance(params, (str, Path)):
            params = SimParams.from_json(params)
        elif not isinstance(params, SimParams):
            raise ValueError(f"SimBackend params must be SimParams, a dict or a JSON path, got {type(params)}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"SimBackend seed must be an int, got {seed!r}")
        if isinstance(fail_rate, bool) or not isinstance(fail_rate, (int, float)) or not 0.0 <= fail_rate <= 1.0:
            raise ValueError(f"SimBackend fail_rate must be a number in [0, 1], got {fail_rate!r}")
        self.params = params
        self.seed = int(seed)
        self.fail_rate = float(fail_rate)
        self.n_failed = 0  # injected failures so far
        self.text_bank = TextBank.load(text_bank) if text_bank is not None else None
        self.n_calls = 0  # generate() calls (the vector env's one-call-per-round test reads this)
        self.n_requests = 0
        log.info("%s SimBackend %s seed=%d fail_rate=%g params=%s", LOG_PREFIX, SIM_MODEL_ID, self.seed,
                 self.fail_rate, params.to_dict())

    @classmethod
    def from_file(cls, path: str | Path, seed: int = 0) -> SimBackend:
        return cls(SimParams.from_json(path), seed=seed)

    # ------------------------------------------------------------ public
    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.n_calls += 1
        self.n_requests += len(requests)
        out = []
        for k, req in enumerate(requests):
            t0 = time.perf_counter()
            if self._injected_failure(req):
                self.n_failed += 1
                out.append(Completion("", 0, 0, "error", time.perf_counter() - t0,
                                      f"{LOG_PREFIX} injected failure (fail_rate={self.fail_rate:g})"))
                continue
            try:
                text, n_words, finish = self._complete(req)
            except ValueError as e:
                out.append(Completion("", self._prompt_tokens(req), 0, "error", time.perf_counter() - t0, str(e)))
                log.warning("%s request %d: %s", LOG_PREFIX, k, e)
                continue
            out.append(Completion(text, self._prompt_tokens(req), n_words, finish, time.perf_counter() - t0))
        log.debug("%s generated %d completions", LOG_PREFIX, len(out))
        return out

    def decide(self, req: ChatRequest) -> TurnDecision:
        """The model's decision for one request, without the text."""
        return self._decide(req, self._rng(req), self._header(req))[0]

    # ------------------------------------------------------------ internals
    def _prompt_tokens(self, req: ChatRequest) -> int:
        chars = sum(len(m.content) for m in req.messages)
        return max(1, int(chars / self.params.prompt_chars_per_token))

    def _header(self, req: ChatRequest) -> SyntheticHeader:
        meta = req.metadata or {}
        h = _header_cached(meta["question_text"]) if meta.get("question_text") else None
        if h is None:  # no metadata (e.g. a direct call): look for the header in the prompt itself
            for m in req.messages:
                h = _header_cached(m.content)
                if h is not None:
                    break
        if h is None:
            raise ValueError(
                "[synthetic] no synthetic question header in metadata['question_text'] or the messages; "
                "the sim backend only answers questions of the 'synthetic' task"
            )
        return h

    def _entropy(self, req: ChatRequest) -> list[int]:
        meta = req.metadata or {}
        who = _stable_int(meta.get("question_id"), meta.get("debate_id"), meta.get("agent"), meta.get("round"))
        if req.seed is None:
            req_seed = _stable_int([m.content for m in req.messages], req.temperature, req.top_p)
        else:
            req_seed = int(req.seed) & 0xFFFFFFFFFFFFFFFF
        return [self.seed & 0xFFFFFFFF, req_seed, who]

    def _rng(self, req: ChatRequest) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence(self._entropy(req)))

    def _injected_failure(self, req: ChatRequest) -> bool:
        """Fault injection: a draw from a generator of its own, so the answers of other requests do not move."""
        if self.fail_rate <= 0.0:
            return False
        if self.fail_rate >= 1.0:
            return True
        return bool(np.random.default_rng([*self._entropy(req), _FAIL_TAG]).random() < self.fail_rate)

    def _draw(self, rng, h: SyntheticHeader, skill: float, d: float, x: float, resolve: bool) -> str:
        p = self.params
        if rng.random() < float(p_correct(p, skill, d, x, resolve)):
            return _canon(h.answer)
        if not h.distractors or rng.random() < p.p_unique_wrong:
            gold = int(_canon(h.answer))
            while True:  # an idiosyncratic wrong number
                v = int(rng.integers(1, 10 * max(100, abs(gold))))
                if v != gold and str(v) not in h.distractors:
                    return str(v)
        w = distractor_weights(p, len(h.distractors))
        return _canon(h.distractors[int(rng.choice(len(w), p=w))])

    def _decide(self, req: ChatRequest, rng, h: SyntheticHeader) -> tuple[TurnDecision, int, float]:
        p = self.params
        meta = req.metadata or {}
        agent = _agent_index(meta.get("agent", 0))
        rnd = int(meta.get("round", 0) or 0)
        skill = p.skill(agent)
        d = float(difficulty_logit(p, h.difficulty))
        x = float(excess(p, req.temperature, req.top_p))
        gold = _canon(h.answer)

        def result(ans: str, moved: bool, mode: str) -> tuple[TurnDecision, int, float]:
            return TurnDecision(ans, ans == gold, moved, mode), agent, x

        own = _canon(meta.get("own_answer"))
        if rnd == 0 or meta.get("fresh"):  # a fresh sample is another independent first answer
            return result(self._draw(rng, h, skill, d, x, resolve=False), False, "round0")
        if own is None:  # nothing to keep: solve again
            return result(self._draw(rng, h, skill, d, x, resolve=True), True, "resolve")
        peers = [a for a in (_canon(a) for a in (meta.get("peer_answers") or [])) if a is not None]
        n_agr = sum(a == own for a in peers)
        n_dis = len(peers) - n_agr
        if rng.random() >= float(p_move(p, n_dis, n_agr, x)):
            return result(own, False, "keep")
        if n_dis > 0 and rng.random() >= p.p_resolve:
            counts: dict[str, int] = {}
            for a in peers:
                if a != own:
                    counts[a] = counts.get(a, 0) + 1
            top = max(counts.values())
            tied = sorted(a for a, c in counts.items() if c == top)
            return result(tied[int(rng.integers(len(tied)))], True, "adopt")
        return result(self._draw(rng, h, skill, d, x, resolve=True), True, "resolve")

    def _complete(self, req: ChatRequest) -> tuple[str, int, str]:
        h = self._header(req)
        rng = self._rng(req)
        dec, agent, _ = self._decide(req, rng, h)
        p = self.params
        temp = max(0.0, float(req.temperature))
        n = int(np.clip(round(p.words_base + p.words_per_temp * temp + rng.normal(0.0, 6.0)), 30, 400))
        answer_words = _words_for("answer", dec.answer, 16)
        conclusion = f"The answer is {dec.answer}, by the {answer_words[0]} {answer_words[1]} step."
        final = f"\\boxed{{{dec.answer}}}"
        sections = f". So the result is {dec.answer}.\nConclusion: {conclusion}\nFinal answer: {final}"
        c = p.text_chars_per_token
        if c > 0:  # n body tokens + the sections' share, written as about that many tokens' worth of characters
            tokens = n + TEXT_OVERHEAD_TOKENS
            n_body = max(1, round((tokens * c - len(sections) - len("Reasoning: ")) / PSEUDO_WORD_CHARS))
        else:
            n_body = n
        words = self._body_words(rng, h, answer_words, agent, temp, n_body)
        sentences = [" ".join(words[i : i + 10]) for i in range(0, len(words), 10)]
        text = "Reasoning: " + ". ".join(s.capitalize() for s in sentences) + sections
        if c <= 0:
            tokens = len(text.split())
        if self.text_bank is not None:  # the decision and length are the sim's; the words are a real completion
            real = self.text_bank.text_for(h, dec.answer, int(meta_round(req)), agent, p.bank_sentence_keep,
                                           p.bank_sentence_mix)
            text = f"{real}\nFinal answer: {final}"
        if tokens > req.max_tokens:  # cut like a real model: the answer sections are lost
            cut = max(0, int(req.max_tokens))
            if c > 0:
                return text[: int(cut * c)].rsplit(" ", 1)[0], cut, "length"
            return " ".join(text.split()[:cut]), cut, "length"
        return text, tokens, "stop"

    @staticmethod
    def _body_words(rng, h: SyntheticHeader, answer_words: tuple[str, ...], agent: int, temp: float,
                    n: int) -> list[str]:
        """n reasoning words: from the answer's vocabulary, the question's topic, the agent's style, or sampling
        noise (more of it at higher T), so texts with the same answer share most of their words."""
        topic_words = _words_for("question", h.id, 12)
        style_words = _words_for("agent", str(agent), 8)
        p_noise = min(0.4, 0.05 + 0.12 * temp)
        probs = np.array([0.80 - p_noise, 0.12, 0.05, 0.03 + p_noise])
        probs /= probs.sum()
        src = rng.choice(4, size=n, p=probs)
        picks = rng.integers(0, 1 << 30, size=n)
        pools = (answer_words, topic_words, style_words, _NOISE)
        sizes = np.array([len(pl) for pl in pools])
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        pool = answer_words + topic_words + style_words + _NOISE
        return [pool[i] for i in (offsets[src] + picks % sizes[src]).tolist()]
