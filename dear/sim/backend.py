"""`SimBackend`: the simulated debaters behind the `Backend` interface (the model: `dear.sim`'s docstring).

It reads the debate engine's request metadata, draws each turn's decision from the model's equations with one
seeded generator per request, and writes the decision as pseudo-word text or, with a text bank, as a real
completion of the matching answer class."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dear.llm.base import Backend, ChatRequest, Completion, count_generated
from dear.sim.bank import TextBank
from dear.sim.confidence import confidence_record, draw_mean_logprob, question_effect
from dear.sim.model import trap_probability, difficulty_logit, distractor_weights, excess, p_correct, p_move
from dear.sim.params import LOG_PREFIX, SIM_MODEL_ID, SimParams
from dear.sim.text import PSEUDO_WORD_CHARS, TEXT_OVERHEAD_TOKENS, body_words, canon_answer, stable_int, words_for
from dear.synthetic_header import SyntheticHeader, parse_header

log = logging.getLogger(__name__)

_FAIL_TAG = 0xFA11  # separates the failure draw's seed from the answer draws' seed
_CONFIDENCE_TAG = 0xC0F1  # ... and the confidence draw's
_TRAP_TAG = 0x7A9  # ... and whether a question is a trap
# Reply styles (request metadata "style", dear.debate.prompts.STYLES) whose agents write the final answer line alone.
ANSWER_ONLY_STYLES = ("direct",)


@lru_cache(maxsize=65536)
def _header_cached(text: str) -> SyntheticHeader | None:
    """parse_header, memoised: every turn of a debate carries the same question text."""
    return parse_header(text)


def _agent_index(agent: Any) -> int:
    """The agent's index from metadata['agent'] (an int, or a name ending in digits such as 'agent-2')."""
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
    """The request's debate round (metadata['round'], 0 when absent)."""
    return int((req.metadata or {}).get("round", 0) or 0)


class SimBackend(Backend):
    """Synthetic debaters driven by `SimParams` (the model: the `dear.sim` docstring)."""

    model_id = SIM_MODEL_ID
    synthetic = True
    context_length = 32768

    def __init__(self, params: SimParams | dict | str | Path | None = None, seed: int = 0, fail_rate: float = 0.0,
                 params_file: str | Path | None = None, text_bank: str | Path | None = None):
        """`params_file` (e.g. `llm.options.params_file` in a train config): a SimParams JSON such as the fit
        written by `python -m simworld.fit`; `params` given with it must be a dict of overrides."""
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
            out.append(Completion(text, self._prompt_tokens(req), n_words, finish, time.perf_counter() - t0,
                                  confidence=self._confidence(req, n_words)))
        log.debug("%s generated %d completions", LOG_PREFIX, len(out))
        return count_generated(out)

    def decide(self, req: ChatRequest) -> TurnDecision:
        """The model's decision for one request, without the text."""
        return self._decide(req, self._rng(req), self._header(req))[0]

    # ------------------------------------------------------------ internals
    def _confidence(self, req: ChatRequest, n_tokens: int) -> dict[str, Any] | None:
        """The turn's confidence record when the request asks for log-probabilities and the world has a confidence
        model (dear.sim.confidence), drawn from a generator of its own so that no answer or text moves."""
        if req.logprobs is None or not self.params.has_confidence:
            return None
        meta = req.metadata or {}
        question = meta.get("question_id") or meta.get("question_text") or req.messages[-1].content
        shared = question_effect(self.params, np.random.default_rng([self.seed & 0xFFFFFFFF, stable_int(question),
                                                                     _CONFIDENCE_TAG]))
        rng = np.random.default_rng([*self._entropy(req), _CONFIDENCE_TAG])
        return confidence_record(draw_mean_logprob(self.params, self.decide(req).correct, shared, rng), n_tokens)

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
        who = stable_int(meta.get("question_id"), meta.get("debate_id"), meta.get("agent"), meta.get("round"))
        if req.seed is None:
            req_seed = stable_int([m.content for m in req.messages], req.temperature, req.top_p)
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
            return canon_answer(h.answer)
        if h.distractors and p.trap_share > 0 and self._is_trap(h, d) and rng.random() < p.trap_pull:
            return canon_answer(h.distractors[0])  # the question's popular mistake
        if not h.distractors or rng.random() < p.p_unique_wrong:
            gold = int(canon_answer(h.answer))
            while True:  # an idiosyncratic wrong number
                v = int(rng.integers(1, 10 * max(100, abs(gold))))
                if v != gold and str(v) not in h.distractors:
                    return str(v)
        w = distractor_weights(p, len(h.distractors))
        return canon_answer(h.distractors[int(rng.choice(len(w), p=w))])

    def _is_trap(self, h: SyntheticHeader, d: float) -> bool:
        """Whether the question (difficulty logit d) is a trap (`trap_probability`), from a generator seeded by the
        question alone, so all its samples agree on it."""
        return bool(np.random.default_rng([self.seed & 0xFFFFFFFF, stable_int(h.id), _TRAP_TAG]).random()
                    < float(trap_probability(self.params, d)))

    def _decide(self, req: ChatRequest, rng, h: SyntheticHeader) -> tuple[TurnDecision, int, float]:
        p = self.params
        meta = req.metadata or {}
        # Who answers is the pool position (metadata "pool_index" when profiles are seated in a shuffled order), so
        # an agent's skill and texts follow its profile from seat to seat.
        agent = _agent_index(meta.get("pool_index", meta.get("agent", 0)))
        rnd = int(meta.get("round", 0) or 0)
        skill = p.skill(agent)
        d = float(difficulty_logit(p, h.difficulty))
        x = float(excess(p, req.temperature, req.top_p))
        gold = canon_answer(h.answer)

        def result(ans: str, moved: bool, mode: str) -> tuple[TurnDecision, int, float]:
            return TurnDecision(ans, ans == gold, moved, mode), agent, x

        own = canon_answer(meta.get("own_answer"))
        if rnd == 0 or meta.get("fresh"):  # a fresh sample is another independent first answer
            return result(self._draw(rng, h, skill, d, x, resolve=False), False, "round0")
        if own is None:  # nothing to keep: solve again
            return result(self._draw(rng, h, skill, d, x, resolve=True), True, "resolve")
        peers = [a for a in (canon_answer(a) for a in (meta.get("peer_answers") or [])) if a is not None]
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
        if (req.metadata or {}).get("style") in ANSWER_ONLY_STYLES:
            return self._answer_line(dec.answer, req.max_tokens)
        temp = max(0.0, float(req.temperature))
        n = int(np.clip(round(p.words_base + p.words_per_temp * temp + rng.normal(0.0, p.words_sd)), 30, 400))
        answer_words = words_for("answer", dec.answer, 16)
        conclusion = f"The answer is {dec.answer}, by the {answer_words[0]} {answer_words[1]} step."
        final = f"\\boxed{{{dec.answer}}}"
        sections = f". So the result is {dec.answer}.\nConclusion: {conclusion}\nFinal answer: {final}"
        c = p.text_chars_per_token
        if c > 0:  # n body tokens + the sections' share, written as about that many tokens' worth of characters
            tokens = n + TEXT_OVERHEAD_TOKENS
            n_body = max(1, round((tokens * c - len(sections) - len("Reasoning: ")) / PSEUDO_WORD_CHARS))
        else:
            n_body = n
        words = body_words(rng, h, answer_words, agent, temp, n_body)
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

    def _answer_line(self, answer: str, max_tokens: int) -> tuple[str, int, str]:
        """An answer-only reply, as a real agent of the `direct` style writes it: the final answer line alone,
        counted by the fitted characters per token (one token per word without them)."""
        text = f"Final answer: {answer}"
        c = self.params.text_chars_per_token
        tokens = max(1, round(len(text) / c)) if c > 0 else len(text.split())
        if tokens > max_tokens:
            return text[: int(max_tokens * c)] if c > 0 else " ".join(text.split()[:max_tokens]), max_tokens, "length"
        return text, tokens, "stop"
