"""eval.report and eval.plots on hand-built traces: record conversion, CSV/Markdown content, non-empty PNGs."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from dear.debate.trace import AgentTurn, DebateTrace
from eval import plots, report


def _turn(agent: int, r: int, key: str | None, ok: bool, grader: str = "numeric") -> AgentTurn:
    return AgentTurn(agent=agent, round=r, messages=[], text="", reasoning="r", conclusion="c", answer=key,
                     answer_key=key, correct=ok, grader=grader if key is not None else "none", temperature=0.7,
                     top_p=0.9, seed=0, peers=[], prompt_tokens=100 * (r + 1), completion_tokens=50,
                     finish_reason="stop", latency_s=0.0)


def _trace(qid: str, rounds: list[list[str | None]], gold: str = "4", tie: bool = False,
           failed: bool = False) -> DebateTrace:
    t = DebateTrace(debate_id=f"b/{qid}", question_id=qid, task="b", question="?", gold=gold, kind="numeric",
                    model_ids=["m"] * len(rounds[0]), tie=tie, failed=failed)
    for r, keys in enumerate(rounds):
        t.add_round([_turn(i, r, k, k == gold) for i, k in enumerate(keys)])
    last = [k for k in rounds[-1] if k is not None]
    t.final_answer = None if failed or not last else max(set(last), key=last.count)
    t.final_correct = t.final_answer == gold
    return t


def test_trace_to_record():
    t = _trace("q1", [["4", "5", None], ["5", "5", "5"]])
    rec = report.trace_to_record(t)
    assert rec.answers == [["4", "5", None], ["5", "5", "5"]]
    assert rec.correct == [[True, False, False], [False, False, False]]
    assert not rec.final_correct and rec.final_grader == "numeric"
    assert rec.prompt_tokens == 3 * 100 + 3 * 200 and rec.completion_tokens == 6 * 50
    assert report.trace_to_record(_trace("q2", [[None, None, None]])).final_grader == "none"


@pytest.fixture()
def results():
    rng = np.random.default_rng(0)
    out = []
    for bench in ("gsm8k", "math500"):
        mad, cot = [], []
        for q in range(12):
            r0 = [rng.choice(["4", "5", "7", None], p=[0.5, 0.3, 0.15, 0.05]) for _ in range(3)]
            r1 = [k if rng.random() < 0.7 else "5" for k in r0]
            r2 = [k if rng.random() < 0.8 else "4" for k in r1]
            mad.append(_trace(f"q{q}", [r0, r1, r2], failed=(q == 11)))
            cot.append(_trace(f"q{q}", [[r0[0]]]))
        out.append(report.evaluate(bench, "cot", "Single CoT", cot, n_boot=200))
        out.append(report.evaluate(bench, "mad", "MAD", mad, n_boot=200))
    return out


def test_csv_markdown_and_plots(tmp_path, results):
    report.write_csv(results, tmp_path / "summary.csv")
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [(r["benchmark"], r["method"]) for r in rows] == [
        ("gsm8k", "cot"), ("gsm8k", "mad"), ("math500", "cot"), ("math500", "mad")]
    assert rows[0]["hcr"] == "" and rows[0]["hcr_den"] == "0"  # NaN rate -> empty cell, denominator kept
    assert rows[1]["failed"] == "1" and "r1->2 C->I" in rows[1]
    md = report.markdown(results, {"command": "python -m eval.run --x", "seed": 0, "synthetic": False})
    assert "`python -m eval.run --x`" in md and "SYNTHETIC" not in md
    assert "| Single CoT |" in md and "Paired difference to MAD" in md
    md_sim = report.markdown(results, {"synthetic": True}, baselines=("cot",))
    assert "SYNTHETIC" in md_sim and "Paired difference to Single CoT" in md_sim
    for path in plots.write_all(results, tmp_path, synthetic=True):
        assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"


def test_an_ablation_is_paired_with_the_method_it_ablates():
    full = [_trace(f"q{q}", [["4", "5", "4"], ["4", "4", "4"]]) for q in range(6)]
    # the control is right on q0..q1 only: DEAR − control = 4 of 6 questions
    control = [_trace(f"q{q}", [["4", "5", "5"], ["4" if q < 2 else "5"] * 3]) for q in range(6)]
    results = [report.evaluate("gsm8k", "dear", "DEAR (sim-fitted)", full, n_boot=200),
               report.evaluate("gsm8k", "dear-random-mask", "DEAR random-mask (sim-fitted)", control, n_boot=200)]
    md = report.markdown(results, {"seed": 0}, n_boot=200)
    section = md.split("to its ablations and controls")[1].split("\n\n##")[0]
    assert "| DEAR (sim-fitted) − DEAR random-mask (sim-fitted) | +66.7 [" in section
    without = report.markdown(results[:1], {"seed": 0}, n_boot=200)
    assert "ablations and controls" not in without


def _frontier_results(bench: str = "b"):
    """cot and its twin: 50 % at 150 tokens/q; sc: 100 % at 450; mad: 50 % at 2,250 (dominated by all three)."""
    gold = ["4", "4", "5", "5"]  # q0, q1 right for the single agent
    single = [_trace(f"q{q}", [[g]]) for q, g in enumerate(gold)]
    return [report.evaluate(bench, "cot", "Single CoT", single, n_boot=50),
            report.evaluate(bench, "twin", "Twin CoT", single, n_boot=50),
            report.evaluate(bench, "sc", "CoT-SC", [_trace(f"q{q}", [["4"] * 3]) for q in range(4)], n_boot=50),
            report.evaluate(bench, "mad", "MAD", [_trace(f"q{q}", [[g] * 3] * 3) for q, g in enumerate(gold)],
                            n_boot=50)]


def test_the_frontier_marks_dominated_methods():
    results = _frontier_results("b") + _frontier_results("c")[:1]
    dominated = report.dominated_by(results)
    assert dominated[("b", "cot")] == dominated[("b", "twin")] == dominated[("b", "sc")] == []  # equal is no better
    assert dominated[("b", "mad")] == ["cot", "twin", "sc"] and dominated[("c", "cot")] == []  # per benchmark
    md = report.markdown(results, {"seed": 0}, n_boot=50)
    table = md.split("## Accuracy and cost")[1].split("###")[0]
    assert "| Method | b acc % [95 % CI] | b tokens/q | c acc % [95 % CI] | c tokens/q | b dominated by | " \
           "c dominated by |" in table
    assert "| 50.0 [" in table and "| 2,250 | – | – | Single CoT, Twin CoT, CoT-SC | – |" in table
    assert "| 150 | 50.0 [" in table and table.count("| — |") == 3 and report.FRONTIER_RULE in table


@pytest.mark.parametrize("synthetic", [False, True])
def test_the_accuracy_tokens_plot_draws_the_frontier(tmp_path, monkeypatch, synthetic):
    results = _frontier_results()
    assert plots.frontier_line(results, "b") == ([150.0, 150.0, 450.0, 2250.0], [50.0, 50.0, 100.0, 100.0])
    drawn = {}

    def keep(fig, axes, text, synthetic_, path):
        drawn["axes"], drawn["synthetic"] = axes, synthetic_

    monkeypatch.setattr(plots, "_finish", keep)
    plots.accuracy_vs_tokens(results, tmp_path / "a.png", synthetic=synthetic)
    (ax,) = drawn["axes"]
    (line,) = [ln for ln in ax.get_lines() if "frontier" in ln.get_label()]
    assert list(line.get_xdata()) == [150.0, 150.0, 450.0, 2250.0] and line.get_drawstyle() == "steps-post"
    assert ("SYNTHETIC" in line.get_label()) == synthetic == drawn["synthetic"]
    faces = {c.get_label(): c.lines[0].get_markerfacecolor() for c in ax.containers}
    assert faces["MAD"] == "none" and faces["CoT-SC"] != "none"  # a dominated method's marker is hollow


def test_a_combined_reports_policy_keeps_its_control_beside_it():
    """In a combined report a second policy's methods are "<key>@<policy>": its random control still pairs with
    its own DEAR, not with the first policy's."""
    from eval.report import _ablated_method

    assert _ablated_method("dear-random-mask") == "dear"
    assert _ablated_method("dear-random-mask@results/policy-x") == "dear@results/policy-x"
    assert _ablated_method("dear@results/policy-x") is None and _ablated_method("mad") is None
