"""eval.score_confidence: stored turns get confidence by teacher forcing — marked, resumable, refused for another
model; and on the real smoke model the scored records equal the ones taken while sampling."""

from __future__ import annotations

import gzip
import json

import pytest

from dear import tasks
from dear.confidence import SCORED_BY, record_of
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.protocols import MajorityProtocol
from dear.llm.base import Backend, ChatRequest, Completion, TokenLogprobs
from eval.score_confidence import RECORD_FILE, read_records, score_file, trace_file


class ForcingDouble(Backend):
    """Scores a text as one token per word, each at log-probability -0.1 x its word index; "FAIL" fails.
    `interrupt_at`: the score call (1-based) that raises KeyboardInterrupt, as a Ctrl-C would."""

    model_id = "double:model"

    def __init__(self, interrupt_at: int | None = None):
        self.calls, self.interrupt_at = 0, interrupt_at

    def generate(self, requests):
        raise AssertionError("scoring never samples")

    def score(self, requests, texts):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        assert all(r.logprobs == 5 for r in requests)
        out = []
        for text in texts:
            if text == "FAIL":
                out.append(Completion("", 0, 0, "error", 0.0, error="forced reply differs"))
                continue
            words = text.split(" ")
            lp = TokenLogprobs(tuple(-0.1 * i for i in range(len(words))),
                               tuple((-0.01, -1.0) for _ in words), tuple(len(w) + 1 for w in words))
            out.append(Completion(text, 10, len(words), "length", 0.0, logprobs=lp))
        return out


def _turn(agent: int, round_: int, text: str) -> dict:
    return {"agent": agent, "round": round_, "messages": [{"role": "user", "content": "q"}], "text": text,
            "answer": "7", "error": None, "confidence": None}


def _record(i: int, model: str = "double:model", texts=("a b c 7", "d 7", "e f")) -> dict:
    rounds = [[_turn(a, 0, t) for a, t in enumerate(texts)], [_turn(0, 1, "revised 7")]]
    return {"kind": "logging", "trace": {"debate_id": f"d{i}", "model_ids": [model], "rounds": rounds}}


def _write(path, records) -> None:
    with open(path, "wb") as f:
        for r in records:
            f.write(gzip.compress((json.dumps(r) + "\n").encode()))


def test_round0_turns_are_scored_marked_and_a_cut_run_resumes(tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    _write(path, [_record(0), _record(1, texts=("g h 7", "FAIL", "i")), _record(2)])
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C during the second batch: the first record is kept
        score_file(path, ForcingDouble(interrupt_at=2), batch_turns=3)
    assert [r["trace"]["debate_id"] for r in read_records(tmp_path / "corpus.jsonl.gz.scoring")] == ["d0"]
    assert all(t["confidence"] is None for r in read_records(path) for rnd in r["trace"]["rounds"] for t in rnd)

    partial = tmp_path / "corpus.jsonl.gz.scoring"
    partial.write_bytes(partial.read_bytes() + gzip.compress(b'{"trace": {"debate_id": "d1"')[:20])  # a killed write
    double = ForcingDouble()
    tally = score_file(path, double, batch_turns=3, command="cmd")
    assert len(list(tmp_path.glob("corpus.jsonl.gz.scoring.cut-*"))) == 1
    assert double.calls == 2 and (tally.records, tally.turns, tally.failed) == (2, 5, 1)
    assert not (tmp_path / "corpus.jsonl.gz.scoring").exists()
    records = list(read_records(path))
    assert [r["trace"]["debate_id"] for r in records] == ["d0", "d1", "d2"]
    first = records[0]["trace"]["rounds"][0][0]["confidence"]
    assert first[SCORED_BY].startswith("teacher forcing, double:model")
    # hand-computed: 4 tokens at 0, -0.1, -0.2, -0.3; "7" is the last token
    assert record_of(first).mean_logprob == pytest.approx(-0.15) and record_of(first).answer_mean == pytest.approx(-0.3)
    assert records[1]["trace"]["rounds"][0][1]["confidence"] == {"missing": "scoring failed: forced reply differs"}
    assert all(r["trace"]["rounds"][1][0]["confidence"] is None for r in records)  # round 1 is left as it was
    run = json.loads((tmp_path / RECORD_FILE).read_text())["runs"][-1]
    assert (run["records"], run["turns_scored"], run["turns_failed"], run["command"]) == (3, 5, 1, "cmd")

    again = score_file(path, ForcingDouble(), batch_turns=3)  # scored turns stay; a failed one is tried again
    assert (again.turns, again.failed) == (0, 1)


def test_another_models_trace_and_a_directory_without_a_trace_file_are_refused(tmp_path):
    path = tmp_path / "samples.jsonl.gz"
    _write(path, [_record(0, model="local:other")])
    assert trace_file(tmp_path) == path
    with pytest.raises(ValueError, match="written by local:other, not by double:model"):
        score_file(path, ForcingDouble())
    with pytest.raises(ValueError, match="expected one of corpus.jsonl.gz, samples.jsonl.gz"):
        trace_file(tmp_path / "nothing-here")


def test_a_backend_without_teacher_forcing_says_so():
    from dear.llm.base import BackendError

    class Plain(Backend):
        model_id = "plain"

        def generate(self, requests):
            return []

    with pytest.raises(BackendError, match="cannot score stored text"):
        Plain().score([ChatRequest(())], [""])


@pytest.fixture(scope="module")
def one_at_a_time():
    """The real smoke model decoding one request at a time: a batch of slots moves log-probabilities (by up to
    ~0.25 a token on this model), so only single decoding is reproducible to the digit."""
    pytest.importorskip("xllamacpp")
    from dear.llm import make_backend

    backend = make_backend("smoke", n_parallel=1, n_ctx=1024, n_threads=1, repeatable=True)
    yield backend
    backend.close()


def test_scored_records_equal_live_ones_on_the_smoke_model(tmp_path, one_at_a_time):
    """A real round 0 sampled with log-probabilities, stored without them, scored: the same records."""
    question = tasks.load("gsm8k", split="test", n=1, seed=0)[0]
    cfg = DebateConfig(n_agents=3, n_rounds=0, max_tokens=24, logprobs=5)
    (debate,) = DebateEngine(one_at_a_time, cfg).run([question], MajorityProtocol())
    trace = debate.trace.to_dict()
    live = [record_of(t["confidence"]) for t in trace["rounds"][0]]
    for t in trace["rounds"][0]:
        t["confidence"] = None
    path = tmp_path / "samples.jsonl.gz"
    _write(path, [{"trace": trace}])
    assert score_file(path, one_at_a_time).turns == 3
    (scored_trace,) = [r["trace"] for r in read_records(path)]
    scored = [record_of(t["confidence"]) for t in scored_trace["rounds"][0]]
    same_split = [(a, b) for a, b in zip(live, scored) if a.n_tokens == b.n_tokens]
    assert len(same_split) >= 2
    for a, b in same_split:
        assert b == a


def test_the_check_scores_a_shelf_and_reports_no_difference_for_single_decoding(tmp_path, one_at_a_time):
    from dear.bank.build import BuildPlan, build
    from dear.bank.store import Bank, ShelfKey
    from eval.score_confidence import check_report, check_samples

    key = ShelfKey("gsm8k", "test", "cot", 0.7, 0.9, 16)
    bank = Bank.open(tmp_path / "bank", "smoke.gguf", "0" * 64)
    build(bank, BuildPlan(key, n=1, samples=3, top_logprobs=5), one_at_a_time, progress=False)
    shelf = bank.shelf(key)
    samples = shelf.of(shelf.questions[0])
    questions = {q.id: q for q in tasks.load("gsm8k", split="test")}
    checks = check_samples(one_at_a_time, samples, questions, "cot")
    assert len(checks) == 3 and all(c.error is None and c.same_prompt for c in checks)
    for c in checks:
        if c.same_split:
            assert c.token_max_diff == 0.0 and all(d in (None, 0.0) for d in c.diffs.values())
    report = check_report(checks, key.name, "cmd")
    assert "| mean_logprob | " in report and "Command: `cmd`" in report
