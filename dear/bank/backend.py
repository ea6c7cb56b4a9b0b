"""The bank world's backend: independent samples are replayed from a sample bank; other turns go elsewhere.

A request for an independent sample (round 0, or a fresh turn: the engine's metadata carries its index `sample`
among the debate's independent samples) is served from the bank's shelf for the question at the request's sampling
setting **snapped to the nearest grid point**: the shelf with the nearest temperature, then the nearest top-p (a
continuous T / top-p from a behavior policy becomes the nearest banked setting; the turn's `source` names the shelf,
so the trace records the snap). Sample n of a debate is the shelf's sample `perm[n]`, where `perm` is a permutation
of the question's stored samples seeded by (seed, debate id): a draw is an exact stored sample, no sample repeats
within a debate, and another debate of the same question sees another order. A pool that mixes reply styles (`cot`
and `pot` agents: option `profile` names each) is served from each agent's style's shelves; the debate's sample
index counts over all of them, so no shelf repeats a sample within a debate. A `pot` sample brings the sandbox run
it was graded by (`Completion.program`): a replayed program never runs again.

When a question's stored samples run out, the `live` backend generates the next one at the shelf's setting (and the
`grow` callback may store it in the bank); without a live backend the request fails with an error naming the shelf
and the command that extends it. Revise turns (a prompt with peers' answers) always go to `live`: the real model
through the response cache, or a fitted simulator when training offline; without one they fail clearly.

Every completion records where it came from in `Completion.source`: `bank:<shelf>#<index>`, or the live backend's
model id. A world that mixes sources is labelled by those sources, turn by turn. Replayed completions add their
recorded completion tokens to `dear.llm.base.REPLAYED_TOKENS` (the live backend counts its own as generated), so a
progress line shows the tokens a bank world goes through, and its tokens/s and ETA, without calling them generated.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from dear.bank.store import Bank, BankSample, Shelf, ShelfKey
from dear.llm.base import REPLAYED_TOKENS, Backend, BackendError, ChatRequest, Completion, serves
from dear.seeds import derive_seed

# The embedded model's committed bank, in the checkout (found from any working directory)
DEFAULT_BANK = str(Path(__file__).resolve().parents[2] / "banks" / "qwen2.5-coder-1.5b-instruct-q4_k_m")
MAX_ORDERS = 65_536  # debates whose order is remembered (a debate's draws all come within its own few rounds)
BANK_SALT = 0xBA4C  # the permutation's seed = derive_seed(seed, crc of the debate id, BANK_SALT)


@dataclass(frozen=True)
class Served:
    """Which stored sample a request got."""

    shelf: ShelfKey
    index: int


def profile_names(profile: str | Sequence[str]) -> tuple[str, ...]:
    """The profiles a bank world serves: one style, several (a list, or "cot,pot"), in order, without repeats."""
    names = profile.split(",") if isinstance(profile, str) else list(profile)
    out = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not out:
        raise BackendError(f"bank option profile: no reply style in {profile!r}")
    return out


def snap(keys: Sequence[ShelfKey], temperature: float, top_p: float) -> ShelfKey:
    """The shelf nearest to (temperature, top_p): nearest temperature first, then nearest top-p (ties: lower)."""
    if not keys:
        raise BackendError("the bank has no shelf for this question's benchmark, split, profile and token limit")
    t = min(sorted({k.temperature for k in keys}), key=lambda v: abs(v - temperature))
    return min(sorted((k for k in keys if k.temperature == t), key=lambda k: k.top_p),
               key=lambda k: abs(k.top_p - top_p))


def at_temperature(keys: Sequence[ShelfKey], temperature: float | None) -> list[ShelfKey]:
    """The shelves at the banked temperature nearest to `temperature` (every shelf when None)."""
    if temperature is None or not keys:
        return list(keys)
    t = snap(keys, temperature, 0.0).temperature
    return [k for k in keys if k.temperature == t]


class BankBackend(Backend):
    """Replays a bank's samples for independent-sample requests (module docstring).

    Args:
        bank: the bank directory (or an open Bank).
        benchmark, split: the shelves' benchmark and split (the questions the world asks).
        profile: the agents' reply style (the shelves' profile), or several for a pool that mixes modes (a sequence,
            or "cot,pot"): each request is served from its agent's style's shelves (the engine's metadata `style`).
        max_tokens: the shelves' token limit (None: the one each profile's shelves share).
        live: the backend for revise turns and for samples beyond the stored ones (None: those fail clearly).
        grow: called with (shelf key, question id, bank index, request sent, completion) after `live` drew a sample beyond the
            stored ones, to store it (e.g. `dear.bank.build.grower`); None keeps the bank as it is.
        seed: mixes into every debate's permutation.
        width: read only each question's first `width` stored samples (index order), as `eval.bank_replay`'s rules
            read them; a debate that needs more is served as beyond the stored ones (None: all stored samples).
        temperature: the one temperature a world with a fixed behavior samples at: only each profile's shelves at
            the banked temperature nearest to it are served, so a question needs samples there alone. None: every
            banked temperature (a learned behavior's requests snap among them, so a question the world asks needs
            samples at each, and the temperature grid's questions bound the world's).
    """

    def __init__(self, bank: str | Bank, benchmark: str = "gsm8k", split: str = "train",
                 profile: str | Sequence[str] = "cot", max_tokens: int | None = None, live: Backend | None = None,
                 grow: Callable[[ShelfKey, str, int, ChatRequest, Completion], None] | None = None,
                 seed: int = 0, width: int | None = None, temperature: float | None = None):
        if width is not None and width < 1:
            raise BackendError(f"bank option width: read at least one stored sample a question, got {width}")
        self.bank = bank if isinstance(bank, Bank) else Bank.open(bank)
        self.profiles = profile_names(profile)
        self.keys_by_profile = {p: at_temperature(self._keys_of(benchmark, split, p, max_tokens), temperature)
                                for p in self.profiles}
        self.keys = [k for keys in self.keys_by_profile.values() for k in keys]
        self.live, self.grow, self.seed, self.width = live, grow, seed, width
        self.model_id = f"bank:{self.bank.manifest['model_file']}"
        self.context_length = live.context_length if live is not None else None
        self._lock = threading.Lock()
        self._orders: dict[tuple[ShelfKey, str], tuple[list[int], int]] = {}

    def _keys_of(self, benchmark: str, split: str, profile: str, max_tokens: int | None) -> list[ShelfKey]:
        """The shelves of one profile (one token limit); BackendError naming what the bank holds otherwise."""
        keys = [k for k in self.bank.keys if (k.benchmark, k.split, k.profile) == (benchmark, split, profile)]
        limits = sorted({k.max_tokens for k in keys})
        if max_tokens is None and len(limits) > 1:
            raise BackendError(f"bank {self.bank.root}: {benchmark}/{split}/{profile} shelves have token limits "
                               f"{limits}; name one (max_tokens)")
        keys = [k for k in keys if max_tokens is None or k.max_tokens == max_tokens]
        if not keys:
            raise BackendError(f"bank {self.bank.root} has no shelf of {benchmark}/{split}/{profile}"
                               + (f" at {max_tokens} tokens" if max_tokens else "")
                               + f"; shelves: {', '.join(k.name for k in self.bank.keys) or 'none'}")
        return keys

    def shelf_for(self, request: ChatRequest) -> Shelf:
        """The request's shelf: its agent's profile (metadata `style`; a debate without profiles: the first
        profile), at the nearest banked setting."""
        style = request.metadata.get("style") or self.profiles[0]
        if style not in self.keys_by_profile:
            raise BackendError(f"the bank world serves profiles {', '.join(self.profiles)}; a {style!r} agent asked "
                               f"(bank option profile: name every style of the pool)")
        return self.bank.shelf(snap(self.keys_by_profile[style], request.temperature, request.top_p))

    def order(self, shelf: Shelf, question_id: str, debate_id: str) -> list[int]:
        """The debate's order of the question's stored sample indices (the first `width`), fixed at its first draw
        (samples the live model adds later follow it, so no draw of the debate moves)."""
        return self._order_and_next(shelf, question_id, debate_id)[0]

    def _order_and_next(self, shelf: Shelf, question_id: str, debate_id: str) -> tuple[list[int], int]:
        """The debate's order and the index its first sample beyond it gets (after every sample stored at the first
        draw), both fixed at the debate's first draw."""
        key = (shelf.key, debate_id)
        with self._lock:
            if key not in self._orders:
                stored = sorted(shelf.samples.get(question_id, {}))
                rng = np.random.default_rng(derive_seed(self.seed, zlib.crc32(debate_id.encode()), BANK_SALT))
                kept = stored[:self.width]
                self._orders[key] = ([kept[i] for i in rng.permutation(len(kept))], max(stored, default=-1) + 1)
                while len(self._orders) > MAX_ORDERS:  # oldest first (dicts keep insertion order)
                    del self._orders[next(iter(self._orders))]
            return self._orders[key]

    def draw(self, request: ChatRequest) -> tuple[Shelf, int, bool]:
        """The shelf and index of a request's sample n, and whether it is stored (within `width`): the n-th of the
        debate's order, or beyond it the index the live model's sample gets (the next after the highest stored)."""
        meta = request.metadata
        shelf = self.shelf_for(request)
        order, beyond = self._order_and_next(shelf, meta["question_id"], meta["debate_id"])
        n = int(meta["sample"])
        if n < len(order):
            return shelf, order[n], True
        return shelf, beyond + (n - len(order)), False

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        to_live: list[int] = []
        for i, request in enumerate(requests):
            if request.metadata.get("sample") is None:
                to_live.append(i)
                continue
            try:
                shelf, index, stored = self.draw(request)
            except BackendError as e:  # a style no shelf serves: this request fails, the others are served
                out[i] = Completion("", 0, 0, "error", 0.0, error=str(e))
                continue
            if stored:
                out[i] = replayed(shelf.samples[request.metadata["question_id"]][index], shelf.key)
            else:
                to_live.append(i)
        REPLAYED_TOKENS.add(sum(c.completion_tokens for c in out if c is not None))
        if to_live:
            for i, completion in zip(to_live, self._live([requests[i] for i in to_live])):
                out[i] = completion
        return out  # type: ignore[return-value]

    def _live(self, requests: list[ChatRequest]) -> list[Completion]:
        if self.live is None:  # an error completion per request (the backend contract: one bad request never raises)
            return [Completion("", 0, 0, "error", 0.0, error=self._why_not_served(r)) for r in requests]
        sent = [self._at_shelf_setting(r) for r in requests]
        completions = self.live.generate(sent)
        for request, completion in zip(sent, completions):
            completion.source = self.live.model_id
            if request.metadata.get("sample") is not None and completion.ok and self.grow is not None:
                shelf, index, _ = self.draw(request)
                with self._lock:
                    self.grow(shelf.key, request.metadata["question_id"], index, request, completion)
        return completions

    def _why_not_served(self, request: ChatRequest) -> str:
        if request.metadata.get("sample") is None:
            return ("the bank world replays independent samples only: a revise turn needs a live backend (the real "
                    "model, or a fitted simulator offline)")
        shelf, index, _ = self.draw(request)
        qid = request.metadata["question_id"]
        if self.width is not None and shelf.n_samples(qid) > self.width:
            return (f"the bank world reads {self.width} samples of a question (width) and the debate needs one more "
                    f"(question {qid}, shelf {shelf.key.name})")
        return (f"bank shelf {shelf.key.name} has {shelf.n_samples(qid)} samples of question {qid}; the debate needs "
                f"sample {index + 1}. Extend it: python -m dear.bank build --benchmark {shelf.key.benchmark} --split "
                f"{shelf.key.split} --samples {index + 1} ..., or give the bank world a live backend")

    def _at_shelf_setting(self, request: ChatRequest) -> ChatRequest:
        """An independent sample beyond the bank is drawn at the snapped shelf's setting (so it can be banked)."""
        if request.metadata.get("sample") is None:
            return request
        key = self.shelf_for(request).key
        return replace(request, temperature=key.temperature, top_p=key.top_p, max_tokens=key.max_tokens)

    def count_tokens(self, text: str) -> int:
        return self.live.count_tokens(text) if self.live is not None else super().count_tokens(text)

    def serves(self, task: str, question_id: str) -> bool:
        """A question of the shelves' benchmark with stored samples on every shelf (any, given a live backend)."""
        if self.live is not None:
            return serves(self.live, task, question_id)
        return task == self.keys[0].benchmark and all(
            self.bank.shelf(k).n_samples(question_id) > 0 for k in self.keys)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()


def replayed(sample: BankSample, key: ShelfKey) -> Completion:
    """A stored sample as the completion it was: text, tokens, finish reason, confidence record and (a `pot` sample)
    its program's sandbox run."""
    return Completion(text=sample.text, prompt_tokens=sample.prompt_tokens, completion_tokens=sample.completion_tokens,
                      finish_reason=sample.finish_reason, latency_s=0.0, confidence=sample.confidence,
                      source=f"bank:{key.name}#{sample.sample}", program=sample.program)
