"""Sample banks: building, extending and resuming a shelf on the real smoke model; checksums; refusals."""

from __future__ import annotations

import gzip

import pytest

from dear.bank.__main__ import main as bank_main
from dear.bank.build import BuildPlan, build
from dear.bank.store import Bank, BankSample, ShelfKey
from dear.debate.engine import default_debate_seed
from dear.seeds import derive_seed
from dear import tasks

KEY = ShelfKey("gsm8k", "test", "cot", 0.7, 0.9, 16)


def _sample(q: str, i: int) -> BankSample:
    return BankSample(q, i, i, f"text {i}", "1", "1", i % 2 == 0, "exact", 10, 5, "stop")


def test_shelf_appends_reloads_and_never_stores_a_sample_twice(tmp_path):
    bank = Bank.open(tmp_path, "m.gguf", "a" * 64)
    shelf = bank.shelf(KEY)
    shelf.append([_sample("q1", 0), _sample("q1", 1)])
    shelf.append([_sample("q1", 1), _sample("q2", 0)])  # q1/1 again: skipped
    bank.record(shelf, {"llm": "test"})
    again = Bank.open(tmp_path).shelf(KEY)
    assert again.questions == ["q1", "q2"] and [s.sample for s in again.of("q1")] == [0, 1]
    assert sum(1 for _ in gzip.open(shelf.path, "rt")) == 3
    assert Bank.open(tmp_path).verify() == []


def test_the_manifest_counts_the_questions_numbered_from_one_seed(tmp_path):
    """A shelf continued with --shared-prompt holds questions of both numberings; the latest build's settings cannot
    say which, so the manifest counts them from the stored seeds."""
    bank = Bank.open(tmp_path, "m.gguf", "a" * 64)
    shelf = bank.shelf(KEY)
    own_seeds = [BankSample("q1", i, seed, "t", "1", "1", True, "exact", 10, 5, "stop") for i, seed in
                 enumerate((907, 13, 4410))]
    one_seed = [BankSample("q2", i, 500 + i, "t", "1", "1", True, "exact", 10, 5, "stop") for i in range(3)]
    shelf.append(own_seeds + one_seed + [BankSample("q3", 0, 77, "t", "1", "1", True, "exact", 10, 5, "stop")])
    bank.record(shelf, {"shared_prompt": True})
    assert [shelf.shares_one_prompt(q) for q in ("q1", "q2", "q3")] == [False, True, False]
    assert Bank.open(tmp_path).manifest["shelves"][KEY.name]["shared_prompt_questions"] == 1


def test_a_damaged_shelf_fails_verification_and_another_model_is_refused(tmp_path):
    bank = Bank.open(tmp_path, "m.gguf", "a" * 64)
    shelf = bank.shelf(KEY)
    shelf.append([_sample("q1", 0)])
    bank.record(shelf, {})
    with open(shelf.path, "ab") as f:
        f.write(b"junk")
    assert Bank.open(tmp_path).verify() == [KEY.name]
    with pytest.raises(ValueError, match="not of other.gguf"):
        Bank.open(tmp_path, "other.gguf", "b" * 64)
    with pytest.raises(FileNotFoundError, match="no sample bank"):
        Bank.open(tmp_path / "nowhere")


def test_two_builds_of_different_shelves_keep_both_manifest_entries(tmp_path):
    """Two processes' Bank objects (each opened before the other wrote) recording different shelves."""
    Bank.open(tmp_path, "m.gguf", "a" * 64)
    first, second = Bank.open(tmp_path), Bank.open(tmp_path)
    other = ShelfKey("gsm8k", "train", "pot", 0.7, 0.9, 384)
    for bank, key, q in ((first, KEY, "q1"), (second, other, "q2"), (first, KEY, "q3")):
        shelf = bank.shelf(key)
        shelf.append([_sample(q, 0)])
        bank.record(shelf, {})
    manifest = Bank.open(tmp_path).manifest["shelves"]
    assert set(manifest) == {KEY.name, other.name} and manifest[KEY.name]["questions"] == 2
    assert Bank.open(tmp_path).verify() == []


@pytest.fixture(scope="module")
def smoke(smoke_backend):
    return smoke_backend


def test_build_extend_and_resume_on_the_smoke_model(tmp_path, smoke):
    bank = Bank.open(tmp_path, "smol.gguf", "c" * 64)
    assert build(bank, BuildPlan(KEY, n=2, samples=3, top_logprobs=2), smoke, progress=False) == 2
    shelf = bank.shelf(KEY)
    first = {q: [s.text for s in shelf.of(q)] for q in shelf.questions}
    # the same plan again: nothing to do; a larger n: only the new question
    assert build(bank, BuildPlan(KEY, n=2, samples=3, top_logprobs=2), smoke, progress=False) == 0
    assert build(bank, BuildPlan(KEY, n=3, samples=3, top_logprobs=2), smoke, progress=False) == 1
    reopened = Bank.open(tmp_path).shelf(KEY)
    questions = tasks.load("gsm8k", "test", n=3, seed=0)
    assert reopened.questions == [q.id for q in questions]
    assert {q: [s.text for s in reopened.of(q)] for q in first} == first
    for q in questions:  # sample i has round-0 agent i's seed, with its confidence
        for s in reopened.of(q.id):
            assert s.seed == derive_seed(0, default_debate_seed(q), s.sample, 0)
            assert s.confidence["n_tokens"] == s.completion_tokens and s.confidence["k"] == 2
    entry = bank.manifest["shelves"][KEY.name]
    assert (entry["questions"], entry["samples"]) == (3, 9) and Bank.open(tmp_path).verify() == []


@pytest.mark.timeout(300)
def test_a_shared_prompt_build_reads_each_prompt_once(tmp_path, smoke):
    """`--shared-prompt`: sample i has sample 0's seed + i and llama.cpp reads each question's prompt once for all
    its samples; two questions in flight, each wanting every slot, both finish."""
    bank = Bank.open(tmp_path, "smol.gguf", "c" * 64)
    read_before = smoke.server_timings.prompt_tokens
    plan = BuildPlan(KEY, n=2, samples=3, top_logprobs=2, shared_prompt=True)
    assert build(bank, plan, smoke, max_in_flight=2, progress=False) == 2
    shelf = Bank.open(tmp_path).shelf(KEY)
    read = smoke.server_timings.prompt_tokens - read_before
    for q in tasks.load("gsm8k", "test", n=2, seed=0):
        samples = shelf.of(q.id)
        assert [s.seed for s in samples] == [derive_seed(0, default_debate_seed(q), 0, 0) + i for i in range(3)]
        # each sample its own log-probabilities (llama.cpp counts a stop's end-of-text token, which has none)
        assert all(s.completion_tokens - (s.finish_reason == "stop") == s.confidence["n_tokens"] for s in samples)
    one_prompt_each = sum(shelf.of(q)[0].prompt_tokens for q in shelf.questions)
    assert read <= one_prompt_each  # (less where the slot's cache held the system prompt)
    assert bank.manifest["shelves"][KEY.name]["generation"]["shared_prompt"] is True
    assert bank.manifest["shelves"][KEY.name]["shared_prompt_questions"] == 2


def test_the_command_builds_shows_and_verifies(tmp_path, capsys):
    pytest.importorskip("xllamacpp")
    argv = ["build", "--llm", "smoke", "--benchmark", "gsm8k", "--split", "test", "--n", "1", "--samples", "2",
            "--max-tokens", "8", "--parallel", "2", "--bank", str(tmp_path), "-q"]
    assert bank_main(argv) == 0
    assert "| gsm8k-test-cot-t0.7-p0.9-m8 | 0.7 | 0.9 | 1 | 2 |" in capsys.readouterr().out
    assert bank_main(["verify", "--bank", str(tmp_path)]) == 0
    assert "every shelf matches" in capsys.readouterr().out


class _Programmer:
    """A test double that answers every request with one program (the sandbox that runs it is the real one)."""

    model_id = "programmer"
    context_length = None

    def generate(self, requests):
        from dear.llm.base import Completion

        return [Completion("```python\nprint(6 * 7)\n```", 30, 12, "stop", 0.0) for _ in requests]

    def close(self):
        pass


def test_a_pot_shelf_stores_each_programs_sandbox_run(tmp_path):
    from dear.bank.backend import BankBackend
    from dear.debate.engine import DebateConfig, DebateEngine
    from dear.debate.protocols import MajorityProtocol
    from dear.llm.base import Backend

    key = ShelfKey("gsm8k", "test", "pot", 0.7, 0.9, 64)
    bank = Bank.open(tmp_path, "m.gguf", "0" * 64)
    backend = type("Programmer", (_Programmer, Backend), {})()
    assert build(bank, BuildPlan(key, n=1, samples=2, top_logprobs=0), backend, progress=False) == 1
    (q,) = tasks.load("gsm8k", "test", n=1, seed=0)
    stored = Bank.open(tmp_path).shelf(key).of(q.id)
    assert [s.answer for s in stored] == ["42", "42"]
    assert all(s.program["verdict"] == "ok" and s.program["stdout"] == "42\n" for s in stored)
    # replayed as a pot agent's turn, the stored run is read (no program runs: the answer is the stored one)
    cfg = DebateConfig(n_agents=2, n_rounds=0, agent_profiles=("pot", "pot"))
    (d,) = DebateEngine(BankBackend(Bank.open(tmp_path), "gsm8k", "test", profile="pot"), cfg).run(
        [q], MajorityProtocol(), [default_debate_seed(q)])
    for t in d.trace.rounds[0]:  # each turn's run is its stored sample's (wall times differ from run to run)
        assert t.program == stored[int(t.source.rpartition("#")[2])].program
