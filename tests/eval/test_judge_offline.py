"""eval.judge_offline: DRIFTJudge on stored debates sends the in-debate judge's exact requests, scores them against
FOCUS, resumes, reports per prompt; plus one real smoke-model run of the command (slow)."""

from __future__ import annotations

import json

import pytest

from dear import tasks
from dear.debate import DebateConfig, DebateEngine, MADProtocol
from dear.debate.interventions import (
    JUDGE_PROMPTS,
    InterventionConfig,
    InterventionProtocol,
    judge_verdict,
    summarize_interventions,
)
from dear.debate.trace import write_jsonl
from dear.llm.base import ChatRequest, Completion
from eval import judge_offline as J
from tests.dear.debate.test_debate_engine import FakeBackend, answer_text

WRONG = "99999"


def _script(judge_reply):
    """Debaters keep the gold answer until round 2, where all answer WRONG (a FOCUS drift); the judge's reply
    comes from `judge_reply(request)`."""

    def reply(r: ChatRequest):
        if r.metadata.get("intervention") == "judge":
            return judge_reply(r)
        return answer_text(r.metadata["agent"], r.metadata["round"],
                           WRONG if r.metadata["round"] == 2 else GOLD)
    return reply


QUESTION = tasks.load("gsm8k", n=1, seed=0)[0]
GOLD = QUESTION.gold


def _debate(judge_prompt: str | None = None, judge_reply=lambda r: "Verdict: NO DRIFT\nReason: fine"):
    """One 3-round MAD debate on a real GSM8K question; with `judge_prompt`, DRIFTJudge runs inside it."""
    be = FakeBackend(_script(judge_reply))
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=3, seed=5))
    if judge_prompt is None:
        (d,) = eng.run([QUESTION], MADProtocol(3, 3))
    else:
        proto = InterventionProtocol(MADProtocol(3, 3), InterventionConfig(judge=True, judge_prompt=judge_prompt))
        (d,) = proto.run(eng, [QUESTION])
    return d.trace, be


def _judge_requests(be: FakeBackend) -> list[ChatRequest]:
    return [r for b in be.calls for r in b if r.metadata.get("intervention") == "judge"]


@pytest.mark.parametrize("prompt", sorted(JUDGE_PROMPTS))
def test_offline_requests_equal_the_in_debate_judge_requests(prompt, tmp_path):
    trace, be = _debate(prompt)
    inside = _judge_requests(be)
    # an answer-naming prompt needs no call on round 1: its plurality equals round 0's
    assert [r.metadata["round"] for r in inside] == ([2, 3] if JUDGE_PROMPTS[prompt].names_answer else [1, 2, 3])
    offline_be = FakeBackend(lambda r: "Verdict: NO DRIFT\nReason: fine")
    pairs = list(J.round_pairs("src", [trace]))
    J.judge_pairs(offline_be, pairs, {"gsm8k": {QUESTION.id: QUESTION}}, InterventionConfig(judge=True,
                  judge_prompt=prompt), seed=5, out=tmp_path / "v.jsonl")
    offline = _judge_requests(offline_be)
    assert [(r.messages, r.seed, r.temperature, r.top_p, r.max_tokens) for r in offline] == \
           [(r.messages, r.seed, r.temperature, r.top_p, r.max_tokens) for r in inside]


def test_stepwise_prompt_lists_both_rounds_final_answers():
    trace, be = _debate("stepwise")
    text = _judge_requests(be)[1].messages[-1].content  # round 1 -> round 2
    assert f"Final answers in round 1: Agent 1: \\boxed{{{GOLD}}}" in text
    assert f"Final answers in round 2: Agent 1: \\boxed{{{WRONG}}}" in text
    assert text.rstrip().endswith("Verdict: NO DRIFT or DRIFT")


def _boxed(answer: str):
    return lambda r: f"Checking the arithmetic step by step.\nCorrect answer: \\boxed{{{answer}}}"


@pytest.mark.parametrize("named, flagged", [(GOLD, [2]), (WRONG, [3])])
def test_verify_judge_names_an_answer_and_focus_with_it_decides(named, flagged):
    trace, be = _debate("verify", _boxed(named))
    judge = [c for c in trace.extra_calls if c.kind == "judge"]
    assert [c.round for c in judge] == [1, 2, 3]
    assert [c.result["skipped"] for c in judge] == [True, False, False] and judge[0].prompt_tokens == 0
    # rounds: all GOLD, all GOLD, all WRONG, all GOLD; drift = the plurality moved away from the named answer
    assert [c.round for c in judge if c.result["drifted"]] == flagged
    s = summarize_interventions([trace])
    assert (s.judge_verdicts, s.judge_skipped, s.calls["judge"]) == (3, 1, 2)
    assert _judge_requests(be)[0].max_tokens == JUDGE_PROMPTS["verify"].max_tokens


def test_verify_judge_without_a_boxed_answer_is_malformed_no_drift():
    trace, _ = _debate()
    prev, cur = trace.rounds[1], trace.rounds[2]
    v = judge_verdict("verify", f"Both could be right; {GOLD} looks plausible.", QUESTION, prev, cur)
    assert v.malformed and not v.drifted
    v = judge_verdict("verify", "Correct answer: \\boxed{12345678}", QUESTION, prev, cur)  # nobody's answer
    assert not v.malformed and not v.drifted and "(no agent's)" in v.reason


def test_verify_offline_records_skipped_pairs_without_a_call(tmp_path):
    src, out = _stored_debate(tmp_path)
    be = FakeBackend(_boxed(GOLD))
    (row,) = J.main(["--traces", str(src), "--out", str(out), "--llm", "openai:http://127.0.0.1:9/v1#fake", "--seed", "5", "--prompt", "verify"],
                    backend=be)
    assert [r.metadata["round"] for r in _judge_requests(be)] == [2, 3]
    assert (row["pairs"], row["calls"], row["tp"], row["fp"], row["tn"], row["fn"]) == (3, 2, 1, 0, 2, 0)
    stored = J.read_verdicts(out / "verdicts.jsonl")
    assert [(v.round, v.skipped) for v in stored] == [(1, True), (2, False), (3, False)]
    again = FakeBackend(_boxed(GOLD))
    J.main(["--traces", str(src), "--out", str(out), "--llm", "openai:http://127.0.0.1:9/v1#fake", "--prompt", "verify"], backend=again)
    assert again.calls == []  # skipped pairs count as judged


def test_unknown_judge_prompt_is_refused():
    with pytest.raises(ValueError, match="judge_prompt must be one of"):
        InterventionConfig(judge=True, judge_prompt="nope")


def _flag_round_2_and_3(r: ChatRequest) -> str:
    return "Verdict: DRIFT\nReason: answers changed" if r.metadata["round"] >= 2 else "Verdict: NO DRIFT\nReason: ok"


def _stored_debate(tmp_path):
    """A 3-round MAD debate (FOCUS drift in round 2 only) written as an eval.run trace file, and an output dir."""
    trace, _ = _debate()
    src = tmp_path / "mad.jsonl"
    write_jsonl([trace], src)
    return src, tmp_path / "judge"


def test_scores_resumes_and_reports_each_prompt(tmp_path):
    src, out = _stored_debate(tmp_path)
    be = FakeBackend(_flag_round_2_and_3)
    (row,) = J.main(["--traces", str(src), "--out", str(out), "--llm", "openai:http://127.0.0.1:9/v1#fake", "--seed", "5", "--prompt", "basic"],
                    backend=be)
    # FOCUS: round 2 fell from all-correct to all-wrong (drift); rounds 1 and 3 did not fall
    assert (row["tp"], row["fp"], row["tn"], row["fn"]) == (1, 1, 1, 0)
    assert row["precision"] == 0.5 and row["recall"] == 1.0 and row["specificity"] == 0.5
    assert row["specificity_low"] < 0.5 < row["specificity_high"]
    lines = (out / "verdicts.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1, 2, 3]
    assert "1/1/1/0" in (out / "judge.md").read_text()

    again = FakeBackend(_flag_round_2_and_3)
    J.main(["--traces", str(src), "--out", str(out), "--llm", "openai:http://127.0.0.1:9/v1#fake", "--seed", "5", "--prompt", "basic"],
           backend=again)
    assert again.calls == []  # every pair already judged with this prompt

    other = FakeBackend(lambda r: "I cannot tell.")
    rows = J.main(["--traces", str(src), "--out", str(out), "--llm", "openai:http://127.0.0.1:9/v1#fake", "--prompt", "stepwise"], backend=other)
    assert len(_judge_requests(other)) == 3
    by_prompt = {r["prompt"]: r for r in rows}
    assert set(by_prompt) == {"basic", "stepwise"}
    assert by_prompt["stepwise"]["malformed"] == 3 and by_prompt["stepwise"]["fn"] == 1  # malformed = no drift


def test_drifted_only_judges_the_focus_drift_pairs_and_marks_the_sample_enriched(tmp_path):
    src, out = _stored_debate(tmp_path)
    be = FakeBackend(_flag_round_2_and_3)
    (row,) = J.main(["--traces", str(src), "--out", str(out), "--llm", "openai:http://127.0.0.1:9/v1#fake", "--seed", "5", "--drifted-only",
                     "--prompt", "basic"], backend=be)
    assert [r.metadata["round"] for r in _judge_requests(be)] == [2]  # the only FOCUS-drift pair
    assert (row["tp"], row["fp"], row["tn"], row["fn"]) == (1, 0, 0, 0) and row["enriched"]
    assert "100.0% [2.5%, 100.0%] (enriched)" in (out / "judge.md").read_text()
    rest = FakeBackend(_flag_round_2_and_3)
    (row,) = J.main(["--traces", str(src), "--out", str(out), "--llm", "openai:http://127.0.0.1:9/v1#fake", "--seed", "5", "--prompt", "basic"],
                    backend=rest)
    assert [r.metadata["round"] for r in _judge_requests(rest)] == [1, 3]  # round 2 is not judged again
    assert (row["tp"], row["fp"], row["tn"], row["fn"]) == (1, 1, 1, 0) and row["enriched"]


def test_backend_errors_are_stored_as_malformed_no_drift(tmp_path):
    trace, _ = _debate()
    be = FakeBackend(lambda r: Completion("", 0, 0, "error", 0.0, error="RuntimeError: slot died"))
    rows = J.judge_pairs(be, list(J.round_pairs("s", [trace])), {"gsm8k": {QUESTION.id: QUESTION}},
                         InterventionConfig(judge=True), 0, tmp_path / "v.jsonl")
    called = [r for r in rows if not r.skipped]
    assert called and all(r.malformed and not r.drifted and r.error for r in called)


def test_bad_inputs_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such.jsonl"):
        J.main(["--traces", str(tmp_path / "no-such.jsonl"), "--out", str(tmp_path / "o")], backend=FakeBackend())
    out = tmp_path / "o2"
    out.mkdir()
    (out / "verdicts.jsonl").write_text('{"key": "a"}\n')
    with pytest.raises(ValueError, match=r"verdicts.jsonl:1"):
        J.main(["--traces", "x", "--out", str(out), "--report-only"], backend=FakeBackend())


def test_corpus_directory_is_read(tmp_path):
    from dear.debate.corpus_file import read_corpus

    corpus = read_corpus("results/corpus-gsm8k")
    pairs = list(J.round_pairs("results/corpus-gsm8k", J.load_traces("results/corpus-gsm8k")))
    assert len(pairs) == 2 * len(corpus)
    assert all(p.trace.task == "gsm8k" for p in pairs)
    assert all(p.trace.question_id in J.question_index("gsm8k") for p in pairs[:6])


@pytest.mark.slow
@pytest.mark.parametrize("prompt, called", [("stepwise", [1, 2, 3]), ("verify-cot", [2, 3])])
def test_real_smoke_model_judges_stored_rounds(tmp_path, prompt, called):
    """The command end to end with a real judge (SmolLM2-135M GGUF through llama.cpp): one verdict line per round
    pair, real token counts for the pairs that need a call, a report. The verdicts' quality is not asserted."""
    trace, _ = _debate()
    src = tmp_path / "mad.jsonl"
    write_jsonl([trace], src)
    out = tmp_path / "judge"
    (row,) = J.main(["--traces", str(src), "--out", str(out), "--llm", "smoke", "--parallel", "3",
                     "--n-ctx", "4096", "--prompt", prompt])
    verdicts = J.read_verdicts(out / "verdicts.jsonl")
    assert sorted(v.round for v in verdicts) == [1, 2, 3]
    assert sorted(v.round for v in verdicts if not v.skipped) == called
    assert all(v.error is None and v.prompt_tokens > 200 and v.text for v in verdicts if not v.skipped)
    assert row["pairs"] == 3 and row["calls"] == len(called) and (out / "judge.md").exists()
