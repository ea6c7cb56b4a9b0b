"""train.learning_check: the rows, their synthetic labels, the train-split choice of the best fixed policy and
resuming row by row (tiny sizes on the sim backend; all numbers synthetic)."""

from __future__ import annotations

import csv
import math
import json

import pytest

from train import learning_check as lc
from train.config import load_config
from train.evaluate import evaluate

TINY = ["run.iterations=1", "rollout.episodes_per_iter=8", "rollout.envs_per_worker=8", "rollout.group_size=1"]


def _main(out, *extra):
    return lc.main(["--config", "sim-stylised", "--seeds", "1", "--out", str(out), "--episodes", "16",
                    "--select-episodes", "8", "--grid-p", "0,1", "--grid-t", "0.1", "--grid-top-p", "0.9",
                    *extra, *TINY])


def test_rows_labels_and_resume(tmp_path, capsys):
    out = tmp_path / "check"
    assert _main(out) == 0
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert [r["key"] for r in rows] == ["round0", "mad", "best-fixed", "dear-1"]
    assert all(r["name"].endswith("(synthetic)") and r["episodes"] == 16 for r in rows)
    best = rows[2]
    assert [s["policy"] for s in best["train_scores"]] == ["p=0, T=0.1, top-p=0.9", "p=1, T=0.1, top-p=0.9"]
    chosen = max(best["train_scores"], key=lambda s: (s["objective"], -s["tokens_per_question"]))
    assert best["detail"] == chosen["policy"]  # by the objective, not by accuracy
    for s in best["train_scores"]:
        assert s["objective"] == pytest.approx(s["accuracy"] - 0.01 * s["tokens_per_question"] / 1000)
    assert rows[0]["tokens_per_question"] < rows[1]["tokens_per_question"]  # round 0 alone costs less than MAD
    with open(out / "rows.csv") as f:
        table = list(csv.DictReader(f))
    assert {r["synthetic"] for r in table} == {"true"} and table[-1]["name"].startswith("DEAR, mean of 1 seeds")
    assert all(len(r["scores"]) == 16 and len(r["objectives"]) == 16 for r in rows)  # per test debate
    dear_csv = table[3]
    d, lo, hi = lc.paired_difference(rows[3]["scores"], rows[1]["scores"])
    assert float(dear_csv["minus_mad"]) == pytest.approx(d) and lo <= d <= hi
    assert d == pytest.approx(rows[3]["accuracy"] - rows[1]["accuracy"])
    mad_csv = table[1]  # objective = accuracy - token_cost x tokens / 1000 (the env's reward, config's cost)
    assert float(mad_csv["objective"]) == pytest.approx(
        float(mad_csv["accuracy"]) - 0.01 * float(mad_csv["tokens_per_question"]) / 1000)
    assert "SYNTHETIC" in (out / "table.md").read_text() and "SYNTHETIC" in capsys.readouterr().out
    # the same command continues: nothing is rerun, nothing appended
    before = (out / "rows.jsonl").read_text()
    assert _main(out) == 0 and (out / "rows.jsonl").read_text() == before
    with pytest.raises(ValueError, match="other settings.*episodes"):  # refused, naming the key
        _main(out, "--episodes", "8")
    # another seed is not another setting: it adds its row, the others stay as they were
    lc.main(["--config", "sim-stylised", "--seeds", "1,2", "--out", str(out), "--episodes", "16",
             "--select-episodes", "8", "--grid-p", "0,1", "--grid-t", "0.1", "--grid-top-p", "0.9", *TINY])
    grown = (out / "rows.jsonl").read_text()
    assert grown.startswith(before) and [json.loads(x)["key"] for x in grown.splitlines()][-1] == "dear-2"


def test_mad_row_is_the_full_mesh_at_the_configs_sampling(tmp_path):
    cfg = load_config("sim-stylised", TINY)
    a = evaluate(cfg, lc.fixed_policy(cfg, lc.mad(cfg)), 16, seed=3, split="test")
    from train.evaluate import mad_policy

    b = evaluate(cfg, mad_policy(cfg), 16, seed=3, split="test")
    assert a["rollout/accuracy"] == b["rollout/accuracy"] and a["rollout/mask_density"] == 1.0
    nobody = evaluate(cfg, lc.fixed_policy(cfg, lc.FixedPolicy(0.0, 0.4, 0.9)), 16, seed=3, split="test")
    assert nobody["rollout/mask_density"] == 0.0 and nobody["rollout/mean_temperature"] == pytest.approx(0.4)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(SystemExit):
        lc.main(["--out", str(tmp_path), "--grid-p", "1.5"])
    with pytest.raises(SystemExit):
        lc.main(["--out", str(tmp_path), "--seeds", "x"])


def test_paired_difference_interval():
    d, lo, hi = lc.paired_difference([1, 0, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0])
    assert d == pytest.approx(2 / 6) and lo < d < hi
    assert lc.paired_difference([1, 1], [1, 1]) == (0.0, 0.0, 0.0)
    assert all(math.isnan(x) for x in lc.paired_difference([1], [0, 1]))


def test_the_suite_runs_worlds_and_writes_a_verdict_per_world(tmp_path):
    out = tmp_path / "suite"
    assert lc.main(["--worlds", "stylised,debate-pays", "--seeds", "2", "--out", str(out), "--episodes", "16",
                    "--select-episodes", "8", "--grid-p", "0,1", "--grid-t", "0.1", "--grid-top-p", "0.9",
                    *TINY]) == 0
    summary = (out / "summary.md").read_text()
    assert "SYNTHETIC" in summary and "| stylised |" in summary and "| debate-pays |" in summary
    for world in ("stylised", "debate-pays"):
        rows = [json.loads(x) for x in (out / world / "rows.jsonl").read_text().splitlines()]
        assert [r["key"] for r in rows] == ["round0", "mad", "best-fixed", "dear-2"]
        assert (out / world / "curves.png").stat().st_size > 0
    # debate-pays has silent turns: reading nobody is one grid point, whatever its (T, top-p)
    pays = [json.loads(x) for x in (out / "debate-pays" / "rows.jsonl").read_text().splitlines()]
    assert len(pays[2]["train_scores"]) == 2
    # the ablation table: an ablation suite beside the defaults, row by row on the same seed and debates
    import shutil

    shutil.copytree(out, tmp_path / "ablations" / "same-as-defaults")
    assert lc.main(["--ablations", str(tmp_path / "ablations"), "--out", str(out)]) == 0
    rows = [ln for ln in (tmp_path / "ablations" / "summary.md").read_text().splitlines() if "(dear-2)" in ln]
    assert len(rows) == 2 and rows[0].split("|")[2:] == rows[1].split("|")[2:]
    with pytest.raises(ValueError, match="nowhere"):  # the CLI prints it as one error line, exit 2
        lc.main(["--worlds", "nowhere", "--out", str(tmp_path / "x")])


def test_dear_is_evaluated_on_the_baselines_debates_whatever_its_training_seed(tmp_path):
    """The DEAR row of seed s sees the same questions and round 0 as the baselines: its round-0 scores are the
    round-0 row's (the check once evaluated with run.seed = s, which changed round 0)."""
    from train.runner import Trainer

    cfg = load_config("sim-stylised", [*TINY, "run.seed=7", f"run.out_dir={tmp_path}", "logging.progress=false"])
    base = load_config("sim-stylised", [*TINY, "logging.progress=false"])
    trainer = Trainer(cfg)
    try:
        trainer.train()
        a, b = [], []
        evaluate(base, trainer.policy, 16, seed=99, split="test", per_episode=a)
        evaluate(base, lc.fixed_policy(base, lc.mad(base)), 16, seed=99, split="test", per_episode=b)
    finally:
        trainer.close()
    assert [e.question_id for e in a] == [e.question_id for e in b]
    assert [e.round0_accuracy for e in a] == [e.round0_accuracy for e in b]


def test_an_extended_suite_summary_holds_dear_against_the_rule_baselines_too(tmp_path):
    """With the extended action set the summary keeps the strict bar (the strongest baseline, here the paper's best
    fixed policy, whose last-round vote the extended policy does not play) and adds DEAR against the best rule
    baseline alone (SC, adaptive SC, MAD-stop)."""
    import numpy as np

    from train import learning_check as lc

    rng = np.random.default_rng(0)

    def row(name, kind, level):
        objectives = list(level + 0.01 * rng.standard_normal(64))
        return lc.Row(name + " (synthetic)", kind, 0.5, 1000.0, 500.0, 0.0, 0.0, 0.7, 64, "detail",
                      [0.5] * 64, objectives).to_dict()

    rows = [row("best fixed policy", "best-fixed", 0.66), row("SC", "sc", 0.44), row("adaptive SC", "adaptive-sc", 0.43),
            row("MAD-stop", "mad-stop", 0.41), row("DEAR, seed 1", "dear", 0.60), row("DEAR, seed 2", "dear", 0.59)]
    assert lc.strongest_baseline(rows)["kind"] == "best-fixed"
    assert lc.strongest_baseline(rows, rules_only=True)["kind"] == "sc"
    assert lc.strongest_baseline(rows[:1], rules_only=True) is None
    lc.write_suite_summary(tmp_path, {"stylised": rows}, "python -m train.learning_check ...")
    (line,) = [ln for ln in (tmp_path / "summary.md").read_text().splitlines() if ln.startswith("| stylised |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == "misses it" and cells[8] == "beats it" and cells[7].endswith("vs SC")
