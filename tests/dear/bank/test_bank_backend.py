"""The bank world's backend: exact replay, no repeats within a debate, the grid snap, an exhausted bank, revise
turns, and growth through a live backend."""

from __future__ import annotations

import re

import pytest

from dear import tasks
from dear.bank.backend import BankBackend, snap
from dear.bank.build import grower
from dear.bank.store import Bank, BankSample, ShelfKey
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.protocols import SamplingRuleProtocol, MajorityProtocol
from dear.llm.base import Backend, BackendError, Completion

Q = tasks.load("gsm8k", "test", n=1)[0]
KEY = ShelfKey("gsm8k", "test", "cot", 0.7, 0.9, 384)
HOT = ShelfKey("gsm8k", "test", "cot", 1.0, 0.9, 384)


def _bank(tmp_path, n=5, answers=None, key=KEY) -> Bank:
    bank = Bank.open(tmp_path, "m.gguf", "0" * 64)
    shelf = bank.shelf(key)
    answers = answers or [str(10 + i) for i in range(n)]
    shelf.append([BankSample(Q.id, i, 100 + i, f"Reasoning: r{i}\nFinal answer: \\boxed{{{a}}}", a, a, a == Q.gold,
                             "exact", 50, 20 + i, "stop", {"mean_logprob": -0.1 * i, "lowest_group": 1.0,
                                                           "tail_mean": -0.1, "answer_mean": None, "margin": None,
                                                           "n_tokens": 20 + i, "k": 5, "window": 16, "tail": 32})
                  for i, a in enumerate(answers)])
    bank.record(shelf, {})
    return bank


def _run(backend, n_agents=3, protocol=None, seeds=(7,)):
    cfg = DebateConfig(n_agents=n_agents, n_rounds=0, logprobs=5)
    return DebateEngine(backend, cfg).run([Q] * len(seeds), protocol or MajorityProtocol(), list(seeds))


def test_round_zero_replays_stored_samples_exactly_without_repeats(tmp_path):
    bank = _bank(tmp_path)
    stored = {s.text: s for s in bank.shelf(KEY).of(Q.id)}
    (d,) = _run(BankBackend(bank, "gsm8k", "test"), n_agents=5)
    turns = d.trace.rounds[0]
    assert sorted(t.text for t in turns) == sorted(stored)  # all 5, each once
    for t in turns:
        s = stored[t.text]
        assert (t.prompt_tokens, t.completion_tokens, t.confidence) == (s.prompt_tokens, s.completion_tokens,
                                                                        s.confidence)
        assert t.source == f"bank:{KEY.name}#{s.sample}"


def test_debates_see_seeded_orders(tmp_path):
    backend = BankBackend(_bank(tmp_path), "gsm8k", "test")
    a, b, again = _run(backend, seeds=(1, 2, 1))
    first = lambda d: [t.text for t in d.trace.rounds[0]]  # noqa: E731
    assert first(a) == first(again) and first(a) != first(b)


def test_fresh_samples_continue_the_debates_order(tmp_path):
    backend = BankBackend(_bank(tmp_path, answers=["1", "2", "3", "4", "4"]), "gsm8k", "test")
    cfg = DebateConfig(n_agents=3, n_rounds=2, logprobs=5, decision="all-answers")
    (d,) = DebateEngine(backend, cfg).run([Q], SamplingRuleProtocol("adaptive-sc-5", n_agents=3, max_samples=5), [3])
    texts = [t.text for t in d.trace.rounds[0]] + [t.text for r in d.trace.rounds[1:] for t in r if t.fresh]
    assert len(texts) == 5 and len(set(texts)) == 5


def test_an_exhausted_bank_is_a_clear_error(tmp_path):
    (d,) = _run(BankBackend(_bank(tmp_path), "gsm8k", "test"), n_agents=6)
    assert d.trace.failed and re.search(r"has 5 samples of question .* needs sample 6.*dear\.bank build", d.trace.error)
    assert sum(t.error is None for t in d.trace.rounds[0]) == 5  # the other requests were served


def test_a_width_reads_only_the_first_stored_samples(tmp_path):
    """width=3 of 5 stored: a debate draws samples 0-2 only (as eval.bank_replay's rules read them) and a fourth
    request is beyond the bank world (an error naming the width), though samples 3 and 4 are stored."""
    backend = BankBackend(_bank(tmp_path), "gsm8k", "test", width=3)
    (d,) = _run(backend, n_agents=3, seeds=(5,))
    assert sorted(t.source.rsplit("#", 1)[1] for t in d.trace.rounds[0]) == ["0", "1", "2"]
    (d,) = _run(backend, n_agents=4)
    assert d.trace.failed and "reads 3 samples of a question (width)" in d.trace.error
    full, narrow = BankBackend(_bank(tmp_path), "gsm8k", "test"), BankBackend(_bank(tmp_path), "gsm8k", "test", width=5)
    texts = lambda b: [t.text for t in _run(b, n_agents=5, seeds=(9,))[0].trace.rounds[0]]  # noqa: E731
    assert texts(full) == texts(narrow)  # a width holding every sample changes no order
    with pytest.raises(BackendError, match="width"):
        BankBackend(_bank(tmp_path), "gsm8k", "test", width=0)


def test_revise_turns_need_a_live_backend(tmp_path):
    from dear.debate.protocols import MADProtocol

    (d,) = _run(BankBackend(_bank(tmp_path), "gsm8k", "test"), protocol=MADProtocol(n_rounds=1))
    assert d.trace.failed and "revise turn needs a live backend" in d.trace.error


def test_a_bank_without_the_shelf_is_refused(tmp_path):
    with pytest.raises(BackendError, match="no shelf of gsm8k/train/cot"):
        BankBackend(_bank(tmp_path), "gsm8k", "train")


def test_the_grid_snap_takes_the_nearest_temperature_then_top_p():
    keys = [KEY, HOT, ShelfKey("gsm8k", "test", "cot", 0.7, 1.0, 384)]
    assert snap(keys, 0.9, 0.9) == HOT and snap(keys, 0.8, 0.95) == KEY and snap(keys, 0.6, 0.97) == keys[2]
    assert snap(keys, 1.18, 1.0) == HOT


def test_a_hot_request_is_served_from_the_nearest_shelf(tmp_path):
    bank = _bank(tmp_path)
    _bank(tmp_path, key=HOT, answers=["7", "8", "9"])
    backend = BankBackend(Bank.open(tmp_path), "gsm8k", "test")
    (d,) = DebateEngine(backend, DebateConfig(n_agents=2, n_rounds=0, temperature0=1.2)).run([Q], MajorityProtocol())
    assert all(t.source.startswith(f"bank:{HOT.name}#") for t in d.trace.rounds[0])
    assert bank.shelf(KEY).n_samples(Q.id) == 5


def test_a_fixed_temperature_reads_only_its_shelves_and_their_questions(tmp_path):
    """A world told its one temperature serves every question its nearest shelf holds, though the hot shelf holds
    none of them; a world of every temperature asks only the questions every shelf holds; the main job's config
    (a fixed behavior) builds the first."""
    from dear.llm.base import serves
    from train.build import make_local_backend
    from train.config import load_config

    _bank(tmp_path)
    other = tasks.load("gsm8k", "test", n=2)[1]
    bank = Bank.open(tmp_path)
    bank.shelf(HOT).append([BankSample(other.id, 0, 1, "Final answer: \\boxed{3}", "3", "3", False, "exact", 50, 20,
                                       "stop")])
    bank.record(bank.shelf(HOT), {})
    every = BankBackend(Bank.open(tmp_path), "gsm8k", "test")
    fixed = BankBackend(Bank.open(tmp_path), "gsm8k", "test", temperature=0.8)
    assert not serves(every, "gsm8k", Q.id) and serves(fixed, "gsm8k", Q.id)
    assert fixed.keys == [KEY]
    (d,) = DebateEngine(fixed, DebateConfig(n_agents=2, n_rounds=0, temperature0=1.2)).run([Q], MajorityProtocol())
    assert all(t.source.startswith(f"bank:{KEY.name}#") for t in d.trace.rounds[0])
    cfg = load_config("gsm8k", [f"llm.spec=bank:{tmp_path}", "env.split=test"])
    assert cfg.policy.behavior_mode == "fixed" and make_local_backend(cfg).keys == [KEY]


class Live(Backend):
    model_id = "live:test"

    def __init__(self):
        self.sent = []

    def generate(self, requests):
        self.sent.extend(requests)
        return [Completion("Final answer: \\boxed{99}", 40, 10, "stop", 0.0) for _ in requests]


def test_the_live_model_extends_an_exhausted_question_and_the_bank_grows(tmp_path):
    bank = _bank(tmp_path, n=2)
    live = Live()
    (d,) = _run(BankBackend(bank, "gsm8k", "test", live=live, grow=grower(bank)), n_agents=3)
    assert [t.source for t in d.trace.rounds[0]].count("live:test") == 1
    assert (live.sent[0].temperature, live.sent[0].top_p, live.sent[0].max_tokens) == (0.7, 0.9, 384)
    grown = Bank.open(tmp_path).shelf(KEY).of(Q.id)
    assert [s.sample for s in grown] == [0, 1, 2] and grown[2].answer == "99"
    assert grown[2].confidence == {"missing": "live: none sent"} and Bank.open(tmp_path).verify() == []


POT = ShelfKey("gsm8k", "test", "pot", 0.7, 0.9, 384)


def _pot_run(printed: str) -> dict:
    """A stored sandbox run that printed `printed` (its code prints something else: a replay must not run it)."""
    return {"code": "print(-1)", "answer_text": printed, "verdict": "ok", "reason": "", "stdout": printed + "\n",
            "stderr": "", "exit_status": 0, "wall_seconds": 0.05, "cpu_seconds": 0.02, "layers": ["static"]}


def _mixed_bank(tmp_path) -> Bank:
    bank = _bank(tmp_path, answers=["10", "11", "12", "13"])
    shelf = bank.shelf(POT)
    shelf.append([BankSample(Q.id, i, 100 + i, "```python\nprint(-1)\n```", a, a, a == Q.gold, "exact", 60, 15,
                             "stop", None, program=_pot_run(a)) for i, a in enumerate(["20", "21", "22", "23"])])
    bank.record(shelf, {})
    return bank


def test_a_pool_that_mixes_modes_replays_each_style_from_its_shelf_without_running_programs(tmp_path, monkeypatch):
    from dear.debate import pot

    def never(*_a, **_k):
        raise AssertionError("a replayed program ran again")

    monkeypatch.setattr(pot, "run_pot", never)
    monkeypatch.setattr(pot, "pot_answer", never)
    backend = BankBackend(_mixed_bank(tmp_path), "gsm8k", "test", profile="cot,pot")
    cfg = DebateConfig(n_agents=3, n_rounds=0, agent_profiles=("cot", "pot", "cot"))
    (d,) = DebateEngine(backend, cfg).run([Q], MajorityProtocol(), [5])
    cot0, pot1, cot2 = d.trace.rounds[0]
    assert cot0.source.startswith(f"bank:{KEY.name}#") and cot2.source.startswith(f"bank:{KEY.name}#")
    assert pot1.source.startswith(f"bank:{POT.name}#") and cot0.source != cot2.source
    index = int(pot1.source.rpartition("#")[2])
    assert pot1.answer == str(20 + index) and pot1.program["stdout"] == f"{20 + index}\n"  # the stored run's answer
    assert {cot0.answer, cot2.answer} <= {"10", "11", "12", "13"}


def test_the_bank_stores_a_pot_samples_run_and_other_shelves_keep_their_form(tmp_path):
    bank = _mixed_bank(tmp_path)
    again = Bank.open(tmp_path)
    assert again.shelf(POT).of(Q.id)[0].program == _pot_run("20")
    assert again.shelf(KEY).of(Q.id)[0].program is None
    assert "program" not in again.shelf(KEY).of(Q.id)[0].to_dict()
    assert bank.verify() == []


def test_a_style_the_bank_world_does_not_serve_is_a_clear_error(tmp_path):
    backend = BankBackend(_mixed_bank(tmp_path), "gsm8k", "test")  # cot only
    cfg = DebateConfig(n_agents=2, n_rounds=0, agent_profiles=("cot", "pot"))
    (d,) = DebateEngine(backend, cfg).run([Q], MajorityProtocol(), [5])
    assert d.trace.failed and "serves profiles cot; a 'pot' agent asked" in d.trace.error
    with pytest.raises(BackendError, match="no shelf of gsm8k/test/direct"):
        BankBackend(_mixed_bank(tmp_path / "b"), "gsm8k", "test", profile=("cot", "direct"))
