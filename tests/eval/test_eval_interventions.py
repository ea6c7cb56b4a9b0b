"""eval.interventions: method names, building MAD and DEAR runs with interventions, the judge's confusion counts
and the report (fast, scripted backend); plus one real smoke-model run of each intervention (slow)."""

from __future__ import annotations

import csv
import math

import pytest

from dear.debate import DebateConfig, DebateEngine, write_jsonl
from dear.debate.interventions import STAGE_INSTRUCTIONS, InterventionProtocol
from dear.debate.trace import ExtraCall
from dear.llm.base import Backend, Completion
from eval import interventions as IV
from eval import methods as M
from tests.dear.debate.test_debate_engine import FakeBackend, gsm
from tests.dear.debate.test_interventions import Script, extra_calls


def test_parse_method_names():
    spec, cfg = IV.parse_intervention_method("mad+judge+policy")
    assert spec.name == "mad" and cfg.judge and cfg.policy and not cfg.regenerate and not cfg.moderator
    _, cfg = IV.parse_intervention_method("mad+judge+regenerate")
    assert cfg.regenerate and not cfg.policy
    _, cfg = IV.parse_intervention_method("mad+moderator")
    assert cfg.moderator and cfg.agenda and not cfg.judge
    _, cfg = IV.parse_intervention_method("mad+moderator-noagenda", relevance_threshold=0.5)
    assert cfg.moderator and not cfg.agenda and cfg.relevance_threshold == 0.5
    spec, cfg = IV.parse_intervention_method("dear+judge+policy")
    assert spec.needs_checkpoint and cfg.policy
    s = IV.intervention_spec("dear-mean+judge")
    assert s.name == "dear-mean+judge" and s.fusion == "mean" and s.kind == "dear" and "DRIFTJudge" in s.label
    assert IV.is_intervention_method("mad+judge") and not IV.is_intervention_method("mad")


@pytest.mark.parametrize("name,match", [
    ("mad+policy", "write mad\\+judge\\+policy"),
    ("mad+regenerate", "write mad\\+judge\\+regenerate"),
    ("cot+judge", "not a debate method"),
    ("nope+judge", "not a debate method"),
    ("mad+judge+drift", "unknown intervention"),
    ("mad+judge+judge", "twice"),
    ("mad+moderator+moderator-noagenda", "twice"),
    ("mad+judge+policy+regenerate", "policy or regenerate"),
    ("mad+", "expected <base>"),
])
def test_bad_method_names(name, match):
    with pytest.raises(ValueError, match=match):
        IV.parse_intervention_method(name)


def test_bad_override_names_the_method():
    with pytest.raises(ValueError, match="mad\\+moderator.*relevance_threshold"):
        IV.parse_intervention_method("mad+moderator", relevance_threshold=2.0)
    with pytest.raises(ValueError, match="bad intervention option"):
        IV.parse_intervention_method("mad+moderator", no_such_option=1)


def test_build_and_run_mad_with_policy():
    base = DebateConfig(n_agents=3, n_rounds=2)
    run = IV.build_intervention_method("mad+judge+policy", base, judge_prompt="basic")
    assert isinstance(run.protocol, InterventionProtocol) and run.protocol.name == "mad+judge+policy"
    be = FakeBackend(Script(verdicts={1: "Verdict: DRIFT\nReason: r"}))
    debates = IV.run_method(run, DebateEngine(be, run.config), [gsm(0), gsm(1)])
    assert all(d.done and d.trace.protocol == "mad+judge+policy" for d in debates)
    assert len(extra_calls(be, "policy")) == 2
    plain = M.build(M.METHODS["mad"], base, 0)
    assert len(IV.run_method(plain, DebateEngine(FakeBackend(), plain.config), [gsm(0)])) == 1


def test_dear_needs_checkpoint_and_runs_with_one(tmp_path):
    from dear.evidence import make_encoder
    from dear.export import export_policy
    from dear.policy import JointPolicy, PolicyConfig

    base = DebateConfig(n_agents=3, n_rounds=2)
    with pytest.raises(ValueError, match="needs --checkpoint"):
        IV.build_intervention_method("dear+judge+policy", base)
    art = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "art", encoder="hashing",
                        training={"llm": "fake", "task": "gsm8k", "n_rounds": 2})
    ckpt = M.load_checkpoint(art)
    run = IV.build_intervention_method("dear+judge+policy", base, ckpt=ckpt, encoder=make_encoder("hashing"),
                                      judge_prompt="basic")
    be = FakeBackend(Script(verdicts={1: "Verdict: DRIFT\nReason: r"}))
    (d,) = IV.run_method(run, DebateEngine(be, run.config), [gsm(0)])
    assert d.done and not d.failed
    assert len(run.protocol.records[d.debate_id]) == 2  # the regulator decided both exchange rounds
    assert len(extra_calls(be, "policy")) == 1
    assert "ADVICE-XYZ" in d.trace.rounds[2][0].messages[-1]["content"]


def _trace_with_judge_calls(calls):
    """A finished MAD trace whose extra_calls are the given (drifted, prev answers, cur answers) judge records."""
    (d,) = DebateEngine(FakeBackend(), DebateConfig(n_agents=2, n_rounds=1)).run([gsm(0)], M.build(
        M.METHODS["mad"], DebateConfig(n_agents=2, n_rounds=1), 0).protocol)
    for drifted, prev, cur in calls:
        d.trace.add_extra_call(ExtraCall("judge", 1, 10, 5, "", {
            "drifted": drifted, "malformed": False, "reason": "",
            "prev": {"answers": [a for a, _ in prev], "correct": [c for _, c in prev]},
            "cur": {"answers": [a for a, _ in cur], "correct": [c for _, c in cur]}}))
    return d.trace


def test_judge_confusion_against_focus_labels():
    right, wrong = ("18", True), ("7", False)
    t = _trace_with_judge_calls([
        (True, [right, right], [wrong, wrong]),  # TP: 1 -> 0
        (True, [right, right], [right, right]),  # FP: 1 -> 1
        (False, [wrong, wrong], [right, right]),  # TN: 0 -> 1
        (False, [right, right], [right, wrong]),  # FN: 1 -> 0.5 (tie)
        (False, [wrong, wrong], [wrong, wrong]),  # TN: 0 -> 0
    ])
    det = IV.judge_confusion([t])
    assert (det.tp, det.fp, det.tn, det.fn) == (1, 1, 2, 1)
    assert det.precision == 0.5 and det.recall == 0.5 and det.specificity == 2 / 3 and det.accuracy == 0.6
    assert IV.judge_confusion([]).n == 0


def test_report_from_results_dir(tmp_path):
    base = DebateConfig(n_agents=3, n_rounds=2)
    out = tmp_path / "res"
    qs = [gsm(i) for i in range(3)]
    script = Script(answers={(1, 0): "7"}, verdicts={1: "Verdict: DRIFT\nReason: r", 2: "nonsense"},
                    ratings={(0, 1): '{"relevance": 0.1, "conflict": "none"}'})
    for name in ("mad", "mad+judge+regenerate", "mad+moderator"):
        run = (IV.build_intervention_method(name, base, judge_prompt="basic") if "+" in name
               else M.build(M.METHODS[name], base, 0))
        debates = IV.run_method(run, DebateEngine(FakeBackend(script), run.config), qs)
        write_jsonl([d.trace for d in debates], out / "traces" / "gsm8k" / f"{name}.jsonl")
    rows = IV.report(out, "gsm8k", ["mad", "mad+judge+regenerate", "mad+moderator"], command="cmd")
    by = {r["method"]: r for r in rows}
    assert by["mad"]["extra_tokens_per_q"] == 0 and by["mad"]["n"] == 3
    reg = by["mad+judge+regenerate"]
    # round 1 is flagged and redone (7 -> 18): every judged round-1 pair is a true positive (1 -> 0)
    # round 2 (after the redo, 18 -> 18) gets malformed verdicts: no drift, a true negative
    assert (reg["judge_tp"], reg["judge_fp"], reg["judge_tn"], reg["judge_fn"]) == (3, 0, 3, 0)
    assert reg["judge_malformed"] == 3
    assert reg["regenerated_rounds"] == 3 and reg["accuracy"] == 1.0 and reg["extra_overhead"] > 0
    # plain MAD keeps the drifted round 1 (all 7) and recovers in round 2; regenerate replaced it
    assert (by["mad"]["drifted_num"], by["mad"]["recovered_num"], reg["drifted_num"]) == (3, 3, 0)
    mod = by["mad+moderator"]
    assert mod["moderator_ignore"] == 3 and math.isclose(mod["rejection_rate"], 3 / 18)
    assert mod["rounds_problem_definition"] == 6  # 3 debates x 2 exchange rounds, max 2 rounds per stage
    assert reg["base_method"] == "mad" and reg["diff_to_base"] == 0.0 and "diff_to_base" not in by["mad"]
    md = (out / "interventions.md").read_text()
    assert "3/0/3/0" in md and "Command: `cmd`" in md and "SYNTHETIC" not in md
    assert "+0.0 [+0.0, +0.0] (vs mad)" in md and "| 6 / 6 |" in md
    with (out / "interventions.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 3
    with pytest.raises(FileNotFoundError, match="mad\\+judge\\+policy"):
        IV.report(out, "gsm8k", ["mad+judge+policy"])


def test_paired_difference_to_the_base_method():
    from types import SimpleNamespace as NS

    def traces(correct):
        return [NS(question_id=f"q{i}", final_expected=float(c)) for i, c in enumerate(correct)]

    rows = [{"method": "mad"}, {"method": "mad+judge+policy"}, {"method": "dear+judge+policy"}]
    IV.paired_to_base(rows, {"mad": traces([1, 1, 0, 0]), "mad+judge+policy": traces([1, 1, 1, 0]),
                             "dear+judge+policy": traces([1, 0, 0, 0])}, n_boot=500)
    assert "diff_to_base" not in rows[0] and "diff_to_base" not in rows[2]  # dear is not in the report
    r = rows[1]
    assert r["base_method"] == "mad" and r["diff_to_base"] == 0.25
    assert r["diff_to_base_low"] == 0.0 and 0.25 <= r["diff_to_base_high"] <= 0.75


def test_cli_bad_method_exits_with_message(tmp_path, capsys):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "eval.interventions", "report", "--out", str(tmp_path), "--benchmark", "gsm8k",
                        "--methods", "mad+policy"], capture_output=True, text=True)
    assert p.returncode == 2 and "write mad+judge+policy" in p.stderr


# ------------------------------------------------------------------ real smoke model
@pytest.fixture(scope="module")
def smoke_backend():
    from dear.llm.registry import make_backend

    be = make_backend("smoke", n_parallel=4, n_ctx=2048, n_threads=1)
    yield be
    be.close()


class FlagEveryRound(Backend):
    """The real backend for every call except the judge's, which always says DRIFT: with a 135M model the judge
    may never flag, and this test must exercise the feedback / regeneration paths on real output."""

    def __init__(self, inner: Backend):
        self.inner, self.model_id, self.context_length = inner, inner.model_id, inner.context_length

    def generate(self, requests):
        out = self.inner.generate([r for r in requests if r.metadata.get("intervention") != "judge"])
        return [Completion("Verdict: DRIFT\nReason: forced by the test", 20, 6, "stop", 0.0)
                if r.metadata.get("intervention") == "judge" else out.pop(0) for r in requests]


@pytest.mark.slow
@pytest.mark.parametrize("name,forced", [("mad+judge", False), ("mad+judge+policy", True),
                                         ("mad+judge+regenerate", True), ("mad+moderator", False)])
def test_smoke_model_runs_each_intervention(smoke_backend, name, forced):
    """Each intervention end to end on the real smoke GGUF (SmolLM2-135M): its calls are made, parsed or
    counted as malformed, and their tokens are counted apart from the debaters'. Quality is not asserted."""
    from dear.debate.interventions import summarize_interventions

    base = DebateConfig(n_agents=2, n_rounds=2, max_tokens=48, temperature0=0.7)
    judge = FlagEveryRound(smoke_backend) if forced else None
    # the forcing judge speaks the "basic" verdict format; the unforced judge runs the default prompt for real
    prompt = {"judge_prompt": "basic"} if forced else {}
    run = IV.build_intervention_method(name, base, backend=judge, judge_max_tokens=32, policy_max_tokens=48,
                                       moderator_max_tokens=64, solution_chars=200, **prompt)
    (d,) = IV.run_method(run, DebateEngine(smoke_backend, run.config), [gsm(3)])
    assert d.done and not d.failed, d.trace.error
    s = summarize_interventions([d.trace])
    assert s.extra_tokens > 0 and s.debater_tokens == d.trace.total_tokens
    assert all(c.error is None for c in d.trace.extra_calls)
    if "judge" in name:
        assert s.judge_verdicts == 2 and s.calls.get("judge", 0) == 2 - s.judge_skipped
        assert all(c.text for c in d.trace.extra_calls if c.kind == "judge" and not c.result["skipped"])
    if "policy" in name:  # the flag after round 1 brings real advice into round 2; none after the last round
        (advice,) = [c for c in d.trace.extra_calls if c.kind == "policy"]
        assert advice.completion_tokens > 0
        if not advice.result["malformed"]:
            assert advice.result["advice"] in d.trace.rounds[2][0].messages[-1]["content"]
    if "regenerate" in name:
        assert s.regenerated_rounds == 2 and [t.attempt for t in d.trace.rounds[2]] == [1, 1]
        assert all(t.temperature >= 1.0 and t.text for r in d.trace.rounds[1:] for t in r)
    if "moderator" in name:
        assert s.moderator_rated == 4 and sum(s.moderator_actions.values()) == 4
        assert sum(s.stage_rounds.values()) == 2
        assert STAGE_INSTRUCTIONS["problem_definition"] in d.trace.rounds[1][0].messages[-1]["content"]


def test_eval_run_with_intervention_methods(tmp_path):
    """`python -m eval.run --methods mad,mad+judge+policy` on the sim backend: every method continues the one
    stored round 0, and the interventions' calls are counted apart from the debaters'."""
    from dear.debate.trace import read_jsonl
    from eval import run as eval_run

    out = tmp_path / "res"
    results = eval_run.main(["--benchmarks", "synthetic", "--n", "2", "--llm", "sim", "--methods",
                             "mad,mad+judge+policy,mad+moderator", "--out", str(out), "--batch", "2",
                             "--n-boot", "50", "--no-progress"])
    assert [r.method for r in results] == ["mad", "mad+judge+policy", "mad+moderator"]
    traces = read_jsonl(out / "traces" / "synthetic" / "mad+judge+policy.jsonl")
    assert len(traces) == 2 and all(sum(c.kind == "judge" for c in t.extra_calls) == 2 for t in traces)
    rows = IV.report(out, "synthetic", ["mad", "mad+judge+policy", "mad+moderator"])
    assert rows[1]["judge_verdicts"] == 4 and rows[2]["moderator_rated"] == 2 * 3 * 2
    mad = read_jsonl(out / "traces" / "synthetic" / "mad.jsonl")
    for a, b in zip(mad, traces):  # the shared round 0
        assert [t.text for t in a.rounds[0]] == [t.text for t in b.rounds[0]]
    for t in traces:  # the default judge needs no call where the plurality held (no skipped call costs tokens)
        assert (t.extra_prompt_tokens > 0) == any(not c.result["skipped"] for c in t.extra_calls)
    assert all(t.extra_prompt_tokens > 0 for t in read_jsonl(out / "traces" / "synthetic" / "mad+moderator.jsonl"))
    assert "SYNTHETIC" in (out / "interventions.md").read_text()


def test_prime_cache_replays_stored_traces(tmp_path):
    """Answers of finished traces, stored in a fresh cache, answer the same method's requests again: the
    model is never called (so a new results directory reuses earlier round 0 and MAD rounds)."""
    from dear.llm.cache import CachedBackend

    class NoCalls(FakeBackend):
        def generate(self, requests):
            raise AssertionError(f"{len(requests)} requests missed the primed cache")

    base = DebateConfig(n_agents=3, n_rounds=2)
    run = M.build(M.METHODS["mad"], base, 0)
    first = IV.run_method(run, DebateEngine(FakeBackend(Script(answers={(1, 0): "7"})), base), [gsm(0), gsm(1)])
    cache = tmp_path / "c.sqlite"
    assert IV.prime_cache(cache, [d.trace for d in first]) == 18
    assert IV.prime_cache(cache, [d.trace for d in first]) == 0  # existing entries are kept
    be = CachedBackend(NoCalls(), cache)
    again = IV.run_method(run, DebateEngine(be, base), [gsm(0), gsm(1)])
    assert be.hits == 18 and [d.trace.answer_keys() for d in again] == [d.trace.answer_keys() for d in first]
    # an intervention run reuses the unchanged MAD rounds; only its own calls reach the model
    inner = FakeBackend(Script(answers={(1, 0): "7"}))
    be = CachedBackend(inner, cache)
    run = IV.build_intervention_method("mad+judge", base)
    IV.run_method(run, DebateEngine(be, base), [gsm(0), gsm(1)])
    assert be.hits == 18 and all("intervention" in r.metadata for b in inner.calls for r in b)
    be.close()
