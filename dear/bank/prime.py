"""Prime a response cache with a shelf's samples, so a live evaluation's round 0 is read from the bank, not generated.

Sample i of a banked question is the completion of the very request round-0 agent i of that question's debate sends
(same prompt, temperature, top-p, token limit and seed: `dear.bank.build`), unless the question was built with a
shared prompt read (`--shared-prompt`: sample i has sample 0's seed + i, so only its sample 0 is that request). `prime_cache` stores each sample in a
response cache (dear/llm/cache.py) under that request's key and the model id that generated it, so `eval.run
--cache PATH` with the same model serves the banked round 0 from it (turns marked `cached`, their `source` naming the
shelf and sample) and generates only what the bank does not hold: the revise turns, and samples beyond the stored
ones. The requests are built by the debate engine itself, and each must carry its sample's stored seed, so a setting
that would send other requests (another engine seed, token limit or reply style) is refused, never cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dear import tasks
from dear.bank.store import Bank, BankSample, Shelf, ShelfKey
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.profiles import AgentProfile
from dear.debate.protocols import MajorityProtocol
from dear.llm import cache
from dear.llm.base import Backend, ChatRequest, Completion


@dataclass(frozen=True)
class Primed:
    """What `prime_cache` stored: entries added (already present ones are kept), questions and the model id keyed."""

    added: int
    entries: int
    questions: int
    model_id: str


def completion_of(sample: BankSample, shelf: ShelfKey) -> Completion:
    """A stored sample as the completion a backend returned for its request (with its confidence record)."""
    return Completion(text=sample.text, prompt_tokens=sample.prompt_tokens, completion_tokens=sample.completion_tokens,
                      finish_reason=sample.finish_reason, latency_s=sample.latency_s, confidence=sample.confidence,
                      source=f"bank:{shelf.name}#{sample.sample}", program=sample.program)


class _Replay(Backend):
    """Answers round-0 request i of a question with its stored sample i, keeping (request, completion) pairs."""

    def __init__(self, shelf: Shelf, model_id: str):
        self.shelf, self.model_id = shelf, model_id
        self.entries: list[tuple[str, ChatRequest, Completion]] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        out = []
        for r in requests:
            question, index = r.metadata["question_id"], r.metadata["sample"]
            stored = self.shelf.samples.get(question, {}).get(index)
            if stored is None:
                raise ValueError(f"shelf {self.shelf.key.name}: no sample {index} of question {question}")
            if stored.seed != r.seed:
                raise ValueError(f"shelf {self.shelf.key.name}: sample {index} of {question} was drawn with seed "
                                 f"{stored.seed}, but this setting's request has seed {r.seed} (another engine "
                                 f"seed or question subset, or a build with --shared-prompt, whose samples after "
                                 f"the first cannot prime); not primed")
            c = completion_of(stored, self.shelf.key)
            self.entries.append((self.model_id, r, c))
            out.append(c)
        return out


def prime_cache(bank: Bank, key: ShelfKey, cache_path, n: int | None = None, samples: int | None = None,
                engine_seed: int = 0, subset_seed: int = 0) -> Primed:
    """Store the round-0 samples of the shelf's questions among the first `n` of the split's seeded subset (default:
    every banked one), `samples` a question (default: those every one of them holds), in the cache at `cache_path`."""
    if key.name not in bank.manifest["shelves"]:
        raise ValueError(f"{bank.root}: no shelf {key.name} (python -m dear.bank show)")
    shelf = bank.shelf(key)
    model_id = bank.manifest["shelves"][key.name].get("generation", {}).get("backend")
    if not model_id:
        raise ValueError(f"shelf {key.name}: its manifest entry names no generating backend (generation.backend)")
    banked = [q for q in tasks.load(key.benchmark, split=key.split, n=n, seed=subset_seed)
              if shelf.n_samples(q.id) > 0]
    if not banked:
        raise ValueError(f"shelf {key.name}: none of the subset's questions is banked")
    width = samples or min(shelf.n_samples(q.id) for q in banked)
    replay = _Replay(shelf, model_id)
    cfg = DebateConfig(n_agents=width, n_rounds=0, temperature0=key.temperature, top_p0=key.top_p,
                       max_tokens=key.max_tokens, seed=engine_seed,
                       agent_profiles=None if key.profile == "cot" else (AgentProfile(style=key.profile),))
    for debate in DebateEngine(replay, cfg).run(banked, MajorityProtocol()):
        if debate.failed:
            raise ValueError(f"shelf {key.name}: question {debate.question.id} could not be replayed ({debate.error})")
    added = cache.prime(cache_path, replay.entries)
    return Primed(added=added, entries=len(replay.entries), questions=len(banked), model_id=model_id)
