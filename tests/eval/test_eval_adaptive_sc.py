"""eval.run's adaptive self-consistency (`adaptive-sc-2`, `adaptive-sc-3`): read from the stored wide round 0
without generating anything, cut to the answers the rule reads, voted like every method, equal to the engine's
SamplingRuleProtocol, and reported like every method. Against a scripted backend whose answer depends only on the
request, as a real model's sample does (the sim backend draws a fresh turn with the drawing agent's own random
stream, so its fresh sample k is round-0 agent k only in distribution)."""

from __future__ import annotations

import csv
import json
import zlib
from pathlib import Path

import pytest

from dear import tasks
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.protocols import SamplingRuleProtocol
from dear.debate.sampling_rules import Samples, rule_outcome
from dear.debate.trace import read_jsonl
from eval import methods as M
from eval import run as eval_run
from tests.dear.debate.test_debate_engine import FakeBackend, answer_text

N, SC = 8, 7
GOLD = {q.question: q.gold for q in tasks.load("gsm8k", n=N, seed=0)}


def by_seed(request) -> str:
    """An answer that depends only on the request (its seed and prompt): the gold one time in two, else one of two
    wrong answers."""
    h = zlib.crc32(f"{request.seed}|{request.messages[-1].content}".encode()) % 4
    gold = GOLD[request.metadata["question_text"]]
    return answer_text(request.metadata["agent"], request.metadata["round"], gold if h < 2 else f"{gold}{h}")


def _args(out: Path, methods: str, *extra: str) -> list[str]:
    # --llm names a valid spec; the scripted backend passed to eval.run is what answers
    return ["--benchmarks", "gsm8k", "--n", str(N), "--llm", "sim", "--methods", methods, "--seed", "0",
            "--out", str(out), "--batch", "3", "--sc-samples", str(SC), "--n-boot", "100", "--max-tokens", "384",
            "--no-cache", "--no-progress", *extra]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """sc first (it stores the 7-wide round 0), then the adaptive methods in the same directory."""
    out = tmp_path_factory.mktemp("adaptive") / "res"
    eval_run.main(_args(out, "cot,sc,majority"), backend=FakeBackend(by_seed))
    backend = FakeBackend(by_seed)
    results = eval_run.main(_args(out, "cot,sc,majority,adaptive-sc-2,adaptive-sc-3"), backend=backend)
    return out, results, backend


def test_the_adaptive_methods_read_the_stored_round0_and_generate_nothing(evaluated):
    out, _, backend = evaluated
    assert backend.calls == []
    round0 = {t.question_id: t for t in read_jsonl(out / "traces" / "gsm8k" / "round0.jsonl")}
    assert {t.n_agents for t in round0.values()} == {SC}
    used = set()
    for rule in ("adaptive-sc-2", "adaptive-sc-3"):
        for t in read_jsonl(out / "traces" / "gsm8k" / f"{rule}.jsonl"):
            stored = round0[t.question_id].rounds[0]
            want = rule_outcome(Samples.of_turns(stored), rule)
            assert [x.text for x in t.rounds[0]] == [x.text for x in stored[:want.used]]
            assert len(t.rounds) == 1 and t.protocol == rule
            assert t.final_score == pytest.approx(want.score)
            assert t.prompt_tokens + t.completion_tokens == want.tokens  # charged only the answers it read
            used.add(want.used)
    assert len(used) > 1  # questions read different prefixes
    scores = {t.final_score for t in read_jsonl(out / "traces" / "gsm8k" / "adaptive-sc-2.jsonl")}
    assert len(scores) > 1  # right and wrong votes (and ties) alike


def test_the_adaptive_methods_decide_as_the_engines_protocol(evaluated):
    """SamplingRuleProtocol draws fresh samples in exchange rounds; fresh sample k is round-0 agent k of the stored
    wide round 0, so the engine's debates and the offline cut score alike."""
    out, _, _ = evaluated
    qs = tasks.load("gsm8k", n=N, seed=0)
    engine = DebateEngine(FakeBackend(by_seed), DebateConfig(n_agents=3, n_rounds=0, max_tokens=384, seed=0))
    for agree in (2, 3):
        offline = {t.question_id: t for t in read_jsonl(out / "traces" / "gsm8k" / f"adaptive-sc-{agree}.jsonl")}
        for d in engine.run(qs, SamplingRuleProtocol(f"adaptive-sc-{agree}", 3, max_samples=SC)):
            t = offline[d.question.id]
            assert d.trace.final_score == pytest.approx(t.final_score)
            assert d.n_samples == len(t.rounds[0])
            assert d.trace.vote_counts == t.vote_counts


def test_the_report_treats_them_like_every_method(evaluated):
    out, results, _ = evaluated
    assert [r.method for r in results] == ["cot", "sc", "majority", "adaptive-sc-2", "adaptive-sc-3"]
    md = (out / "summary.md").read_text()
    for label in ("Adaptive SC (until 2 agree)", "Adaptive SC (until 3 agree)"):
        rows = [line for line in md.splitlines() if line.startswith(f"| {label} |")]
        assert len(rows) >= 4  # the summary table, the detail table, the paired differences to sc, majority, cot
    assert "adaptive self-consistency = the first V" in md
    with open(out / "summary.csv") as f:
        assert [r["method"] for r in csv.DictReader(f)][-2:] == ["adaptive-sc-2", "adaptive-sc-3"]


def test_round0_width_and_sc_samples_checks(tmp_path):
    assert M.round0_width(["adaptive-sc-2"], 3, 7) == 7 == M.round0_width(["sc", "mad"], 3, 7)
    assert M.round0_width(["cot", "majority", "mad", "dear"], 3, 7) == 3
    # the default list reads the same round 0 with the adaptive methods as without them (sc is in it)
    plain = [m for m in M.DEFAULT_METHODS if not M.METHODS[m].rule]
    assert "adaptive-sc-2" in M.DEFAULT_METHODS and M.round0_width(M.DEFAULT_METHODS, 3, 9) == M.round0_width(plain, 3, 9)
    eval_run.main(_args(tmp_path / "alone", "adaptive-sc-3"), backend=FakeBackend(by_seed))
    (t,) = {t.n_agents for t in read_jsonl(tmp_path / "alone" / "traces" / "gsm8k" / "round0.jsonl")}
    assert t == SC
    bad = _args(tmp_path / "bad", "adaptive-sc-3")
    bad[bad.index("--sc-samples") + 1] = "2"
    with pytest.raises(ValueError, match=r"'adaptive-sc-3' .* needs --sc-samples >= 3, got 2"):
        eval_run.main(bad)


def test_rules_started_at_fewer_samples_and_esc_read_the_stored_round0(tmp_path):
    """adaptive-sc-A-from-S and esc-W: each question's stored prefix cut where the rule stops, nothing generated, the
    engine's vote equal to the rule's own outcome."""
    out = tmp_path / "res"
    eval_run.main(_args(out, "sc"), backend=FakeBackend(by_seed))
    names = ["adaptive-sc-2-from-1", "adaptive-sc-2-from-2", "adaptive-sc-3-from-2", "esc-2", "esc-3"]
    backend = FakeBackend(by_seed)
    eval_run.main(_args(out, ",".join(["sc", *names])), backend=backend)
    assert backend.calls == []
    round0 = {t.question_id: t for t in read_jsonl(out / "traces" / "gsm8k" / "round0.jsonl")}
    for name in names:
        for t in read_jsonl(out / "traces" / "gsm8k" / f"{name}.jsonl"):
            want = rule_outcome(Samples.of(round0[t.question_id]), name)
            assert t.n_agents == want.used and t.final_expected == pytest.approx(want.score)
    text = (out / "summary.md").read_text()
    assert "Paired difference to Adaptive SC (from 2, until 2 agree)" in text


def test_a_rule_that_cannot_reach_its_agreement_is_refused():
    with pytest.raises(ValueError, match=r"esc-3.*needs --sc-samples >= 3, got 2"):
        M.check_adaptive([M.METHODS["esc-3"]], n_agents=3, sc_samples=2)
    M.check_adaptive([M.METHODS["adaptive-sc-2-from-1"]], n_agents=3, sc_samples=2)


def confident_by_seed(request):
    """`by_seed`'s answer with one token whose log-probability also depends only on the request."""
    from dear.llm.base import Completion, TokenLogprobs

    text = by_seed(request)
    c = -((zlib.crc32(f"c|{request.seed}".encode()) % 100) / 200)
    return Completion(text, 20, 10, "stop", 0.01, logprobs=TokenLogprobs((c,), ((c, c - 1.0),), (len(text.encode()),)))


def test_the_confidence_rules_read_the_stored_round0_with_its_confidences(tmp_path):
    """cisc-3 and confident-stop: the round 0 asks for log-probabilities, each rule reads its prefix with the fitted
    parameters of --rule-params and votes as its definition does; run.json records both settings."""
    from dear.debate.sampling_rules import FittedParams, RuleParams

    fitted = FittedParams({"cisc-3": RuleParams(tau=0.05), "confident-stop": RuleParams(tau=0.05, threshold=-0.2)},
                          "mean_logprob", {"fit_shelf": "made-up"})
    params = tmp_path / "params.json"
    params.write_text(fitted.to_json())
    out = tmp_path / "res"
    backend = FakeBackend(confident_by_seed)
    eval_run.main(_args(out, "sc,cisc-3,confident-stop", "--rule-params", str(params)), backend=backend)
    round0 = {t.question_id: t for t in read_jsonl(out / "traces" / "gsm8k" / "round0.jsonl")}
    assert all(Samples.of(t).confidence is not None for t in round0.values())
    used = set()
    for rule in ("cisc-3", "confident-stop"):
        for t in read_jsonl(out / "traces" / "gsm8k" / f"{rule}.jsonl"):
            want = rule_outcome(Samples.of(round0[t.question_id]), rule, params=fitted.of(rule))
            assert len(t.rounds[0]) == want.used and t.final_score == pytest.approx(want.score), rule
            assert (t.decision, t.vote_tau) == ("confidence-weighted", 0.05)
            used.add((rule, want.used))
    assert {("confident-stop", 1), ("cisc-3", 3)} <= used and len(used) > 2  # confident stop stops and goes on
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["logprobs"] == 5 and settings["rule_params"] == str(params.resolve())


def test_a_confidence_rule_on_a_round0_stored_without_confidences_says_so(tmp_path):
    out = tmp_path / "res"
    eval_run.main(_args(out, "sc"), backend=FakeBackend(by_seed))
    with pytest.raises(ValueError, match="'cisc-3' reads the samples' confidences; this stored round 0 has none"):
        eval_run.main(_args(out, "sc,cisc-3"), backend=FakeBackend(confident_by_seed))


def test_eval_runs_the_confidence_rules_on_a_real_model(tmp_path):
    """eval.run on the smoke model (real llama.cpp log-probabilities): the stored round 0 carries a confidence on
    every sample and the confidence rules vote by it with the committed GSM8K-train fit."""
    out = tmp_path / "res"
    args = ["--benchmarks", "gsm8k", "--n", "2", "--llm", "smoke", "--methods", "sc,cisc-3,confident-stop",
            "--seed", "0", "--out", str(out), "--batch", "2", "--sc-samples", "3", "--n-boot", "50",
            "--max-tokens", "24", "--no-cache", "--no-progress"]
    pytest.importorskip("xllamacpp")
    eval_run.main(args)  # builds the smoke backend itself (and closes it)
    round0 = read_jsonl(out / "traces" / "gsm8k" / "round0.jsonl")
    assert all(None not in Samples.of(t).confidence for t in round0)
    for rule in ("cisc-3", "confident-stop"):
        assert {t.decision for t in read_jsonl(out / "traces" / "gsm8k" / f"{rule}.jsonl")} == {"confidence-weighted"}
