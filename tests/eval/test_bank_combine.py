"""eval.bank_combine: the goal of a real evaluation checked on constructed rows, and the side-by-side report."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dear.metrics import CI
from eval import bank_combine as C
from eval import bank_replay as B
from tests.eval.test_bank_replay import _tiny_bank


def _row(label, rule, accuracy, tokens, diff=(0.0, 0.0, 0.0), frontier=True, policy=""):
    return C.ReportRow(label, rule, policy, accuracy, CI(*diff), tokens, frontier)


def _bench(benchmark, *rows):
    base = _row("adaptive SC", C.BASELINE, 0.62, 1400)
    return C.Benchmark(Path("x"), benchmark, "shelf", 200, False, (base, *rows))


def test_the_goal_on_gsm8k_needs_accuracy_floor_and_a_quarter_fewer_tokens():
    cheap = _row("DEAR", "dear", 0.615, 1000, (-0.005, -0.02, 0.01), policy="p")
    g = C.check_goal(_bench("gsm8k", cheap), cheap)
    assert (g.accuracy_ok, g.tokens_ok, g.met) == (True, True, True)
    assert g.tokens_ratio == pytest.approx(1000 / 1400)
    wide = _row("DEAR", "dear", 0.615, 1000, (-0.005, -0.031, 0.01), policy="p")  # the CI reaches below -3 points
    assert not C.check_goal(_bench("gsm8k", wide), wide).met
    dear = _row("DEAR", "dear", 0.615, 1100, (-0.005, -0.02, 0.01), policy="p")  # 0.79 x the tokens
    assert C.check_goal(_bench("gsm8k", dear), dear).tokens_ok is False
    # elsewhere only the frontier and the confidence rules count
    g = C.check_goal(_bench("math500", dear), dear)
    assert (g.accuracy_ok, g.tokens_ok, g.met) == (None, None, True)


def test_a_dominating_confidence_rule_fails_the_goal_and_is_named():
    dear = _row("DEAR", "dear", 0.60, 1100, (-0.02, -0.03, 0.0), frontier=False, policy="p")
    cisc = _row("CISC-3", "cisc-3", 0.61, 1100)
    sc = _row("SC-3", "sc-3", 0.60, 1000)  # dominates too, but is no confidence rule
    g = C.check_goal(_bench("gpqa_diamond", dear, cisc, sc), dear)
    assert g.confidence_dominators == ("CISC-3",) and not g.met


def _report(tmp_path, name, synthetic=False):
    out = tmp_path / name
    _tiny_bank(tmp_path / f"bank-{name}")
    assert B.main(["--bank", str(tmp_path / f"bank-{name}"), "--out", str(out), "--orders", "2", "--n-boot", "20"]) == 0
    if synthetic:
        rows = list(csv.DictReader((out / "summary.csv").open(encoding="utf-8")))
        for r in rows:
            r["synthetic"] = "True"
        with (out / "summary.csv").open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return out


def test_reports_side_by_side(tmp_path):
    a, b = _report(tmp_path, "a"), _report(tmp_path, "b")
    assert C.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert md.count("gsm8k acc %") == 2 and "| SC-9 |" in md and "no policy row" in md
    assert "real model's stored samples" in md


def test_bad_input_is_refused_with_the_file_named(tmp_path):
    real, fake = _report(tmp_path, "a"), _report(tmp_path, "b", synthetic=True)
    with pytest.raises(ValueError, match="never combined"):
        C.main([str(real), str(fake), "--out", str(tmp_path / "out")])
    with pytest.raises(ValueError, match="summary.csv: not found"):
        C.main([str(tmp_path), "--out", str(tmp_path / "out")])
    rows = (real / "summary.csv").read_text(encoding="utf-8").replace(",policy", ",x")
    (real / "summary.csv").write_text(rows, encoding="utf-8")
    with pytest.raises(ValueError, match=r"summary.csv: no column policy"):
        C.main([str(real), "--out", str(tmp_path / "out")])


def _live_dir(root: Path, scores: dict[str, float], tokens: float, method: str = "mad") -> Path:
    """An eval.run results directory holding one live method's traces on gsm8k."""
    import json

    (root / "traces" / "gsm8k").mkdir(parents=True)
    (root / "summary.csv").write_text(f"benchmark,method,label\ngsm8k,{method},MAD\ngsm8k,cot,Single CoT\n",
                                      encoding="utf-8")
    with (root / "traces" / "gsm8k" / f"{method}.jsonl").open("w", encoding="utf-8") as fh:
        for q, score in scores.items():
            fh.write(json.dumps({"question_id": q, "failed": False, "final_score": score, "prompt_tokens": tokens - 100,
                                 "completion_tokens": 100}) + "\n")
    (root / "traces" / "gsm8k" / "cot.jsonl").write_text("", encoding="utf-8")  # replayable: never a live row
    return root


def test_live_methods_join_on_the_questions_they_share(tmp_path):
    report = _report(tmp_path, "a")
    # MAD debated 3 of the report's 4 questions, and one the bank does not hold; right on two of them
    live = _live_dir(tmp_path / "live", {"gsm8k-test-0": 1.0, "gsm8k-test-1": 1.0, "gsm8k-test-2": 0.0,
                                         "elsewhere": 1.0}, tokens=5000)
    assert C.main([str(report), "--out", str(tmp_path / "out"), "--live", str(live), "--n-boot", "50"]) == 0
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert "## gsm8k: the methods run live, on the 3 questions they share with the bank" in md
    bench = C.read_report(report)
    table = C.live_table(bench, C.live_methods_of(live), 50, 0)
    assert table.questions == ("gsm8k-test-0", "gsm8k-test-1", "gsm8k-test-2")
    mad = table.rows[-1]
    assert mad.label == "MAD (live, `live`)" and mad.accuracy == pytest.approx(2 / 3) and mad.tokens == 5000
    assert not mad.frontier  # SC-9 is right on as many at fewer tokens
    per_q = C.per_question(bench)
    sc9 = next(r for r in table.rows if r.label == "SC-9")
    assert sc9.accuracy == pytest.approx(sum(per_q["SC-9"][q][0] for q in table.questions) / 3)
    base = next(r for r in table.rows if r.rule == C.BASELINE)
    assert base.diff == CI(0.0, 0.0, 0.0)
    assert mad.diff.mean == pytest.approx(mad.accuracy - base.accuracy)


def test_live_input_is_checked(tmp_path):
    report = _report(tmp_path, "a")
    with pytest.raises(ValueError, match="summary.csv: not found .* --live"):
        C.main([str(report), "--out", str(tmp_path / "out"), "--live", str(tmp_path / "nothing")])
    apart = _live_dir(tmp_path / "apart", {"elsewhere": 1.0}, tokens=10)
    with pytest.raises(ValueError, match="share no question"):
        C.main([str(report), "--out", str(tmp_path / "out"), "--live", str(apart)])
    (report / "per_question.csv").unlink()
    live = _live_dir(tmp_path / "live", {"gsm8k-test-0": 1.0}, tokens=10)
    with pytest.raises(ValueError, match="per_question.csv: not found"):
        C.main([str(report), "--out", str(tmp_path / "out"), "--live", str(live)])
    (live / "traces" / "gsm8k" / "mad.jsonl").write_text("{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"mad.jsonl:1: not a debate trace"):
        C.live_methods_of(live)


def test_a_live_method_that_dominates_on_the_shared_questions_fails_the_goal():
    dear = _row("DEAR", "dear", 0.62, 1000, (-0.005, -0.02, 0.01), policy="p")
    bench = _bench("math500", dear)
    on_shared = (_row("DEAR", "dear", 0.60, 1000), _row("SC-8", "sc-8", 0.65, 900), _row("MAD (live)", "mad", 0.61, 900))
    g = C.check_goal(bench, dear, C.LiveTable("math500", ("q1", "q2"), on_shared, ("MAD (live)",)))
    assert g.live_dominators == ("MAD (live)",) and not g.met  # SC-8 is judged on the full report, not here
    cheaper = (_row("DEAR", "dear", 0.60, 1000), _row("MAD (live)", "mad", 0.61, 9000))
    g = C.check_goal(bench, dear, C.LiveTable("math500", ("q1", "q2"), cheaper, ("MAD (live)",)))
    assert g.live_dominators == () and g.met
    assert C.check_goal(bench, dear).live_dominators is None
