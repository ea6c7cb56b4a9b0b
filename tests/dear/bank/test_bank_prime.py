"""A response cache primed with a shelf's samples: a debate's (and eval.run's) round 0 is read from the bank, only the
revise turns are generated — on the real smoke model and a real SQLite cache."""

from __future__ import annotations

import json

import pytest

from dear import tasks
from dear.bank.build import BuildPlan, build
from dear.bank.prime import prime_cache
from dear.bank.store import Bank, ShelfKey
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.protocols import MADProtocol
from dear.llm.cache import CachedBackend
from dear.llm.wrapper import BackendWrapper

KEY = ShelfKey("gsm8k", "test", "cot", 0.7, 0.9, 96)


class Counting(BackendWrapper):
    """Counts the requests that reach the model; closing it leaves the shared smoke model open."""

    def __init__(self, inner):
        super().__init__(inner)
        self.requests = 0

    def generate(self, requests):
        self.requests += len(requests)
        return self.inner.generate(requests)

    def close(self):
        pass


@pytest.fixture(scope="module")
def smoke_bank(tmp_path_factory, smoke_backend):
    bank = Bank.open(tmp_path_factory.mktemp("bank"), "smoke.gguf", "0" * 64)
    build(bank, BuildPlan(KEY, n=2, samples=3), smoke_backend, progress=False)
    return bank


def test_a_primed_cache_serves_round_zero_from_the_bank(tmp_path, smoke_bank, smoke_backend):
    cache = tmp_path / "cache.sqlite"
    primed = prime_cache(smoke_bank, KEY, cache)
    assert (primed.added, primed.entries, primed.questions) == (6, 6, 2)
    assert primed.model_id == smoke_backend.model_id
    assert prime_cache(smoke_bank, KEY, cache).added == 0  # priming again adds nothing

    model = Counting(smoke_backend)
    questions = tasks.load("gsm8k", split="test", n=2, seed=0)
    cfg = DebateConfig(n_agents=3, n_rounds=1, temperature0=0.7, top_p0=0.9, max_tokens=96, seed=0)
    debates = DebateEngine(CachedBackend(model, cache), cfg).run(questions, MADProtocol(n_rounds=1))
    shelf = smoke_bank.shelf(KEY)
    for d in debates:
        for turn, stored in zip(d.trace.rounds[0], shelf.of(d.question.id)):
            assert turn.cached and turn.text == stored.text and turn.source == f"bank:{KEY.name}#{stored.sample}"
        assert not any(t.cached for t in d.trace.rounds[1])
    assert model.requests == 6  # the revise turns only


def test_a_setting_that_sends_other_requests_is_refused(tmp_path, smoke_bank):
    with pytest.raises(ValueError, match="drawn with seed .* not primed"):
        prime_cache(smoke_bank, KEY, tmp_path / "cache.sqlite", engine_seed=1)
    with pytest.raises(ValueError, match="no shelf gsm8k-test-cot-t0.7-p0.9-m16"):
        prime_cache(smoke_bank, ShelfKey("gsm8k", "test", "cot", 0.7, 0.9, 16), tmp_path / "cache.sqlite")
    assert not (tmp_path / "cache.sqlite").exists()


@pytest.mark.slow
def test_eval_run_reads_its_round_zero_from_a_primed_cache(tmp_path, smoke_bank):
    from dear.bank.__main__ import main as bank_main
    from eval import run as eval_run

    out = tmp_path / "eval"
    assert bank_main(["prime-cache", "--bank", str(smoke_bank.root), "--cache", str(out / "cache.sqlite"),
                      "--shelf", KEY.name]) == 0
    eval_run.main(["--benchmarks", "gsm8k", "--n", "2", "--llm", "smoke", "--methods", "majority,mad",
                   "--n-rounds", "1", "--max-tokens", "96", "--out", str(out), "--no-progress", "--n-boot", "50"])
    traces = [json.loads(line) for line in (out / "traces" / "gsm8k" / "mad.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for t in traces:
        assert all(turn["cached"] and turn["source"].startswith("bank:") for turn in t["rounds"][0])
        assert not any(turn["cached"] for turn in t["rounds"][1])
