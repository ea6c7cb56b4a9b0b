"""simworld.map_fit: the first (MAP) fit of the simulator on a trace file, and its collection mode (kept because
results/sim_fit/ was made by them). All numbers here are synthetic except the slow smoke-model test's."""

from __future__ import annotations

import pytest

from dear import sim
from dear.sim import SimBackend, SimParams
from dear.sim.records import read_traces, write_records
from simworld import map_fit
from simworld.rates import compute_stats
from simworld.replay import random_schedules, simulate


def test_fit_recovers_known_parameters():
    true = SimParams(skills=[0.0, 0.0, 0.0], difficulty_center=0.2, difficulty_scale=1.5, switch_bias=-1.5,
                     switch_disagree=1.5, switch_agree=2.0, p_resolve=0.5, resolve_bonus=1.0, p_unique_wrong=0.3)
    records = simulate(SimBackend(true, seed=1), random_schedules(1200, seed=3), 1, seed=5)
    p, info = map_fit.fit(records)
    assert info["round0_converged"] and info["transitions"] == 3600
    assert abs(p.difficulty_center - 0.2) < 0.25 and abs(p.difficulty_scale - 1.5) < 0.3
    assert abs(p.p_unique_wrong - 0.3) < 0.1
    assert abs(p.p_resolve - 0.5) < 0.2 and abs(p.resolve_bonus - 1.0) < 0.6
    # the move probabilities that matter (disagreeing peers) are recovered
    for n_dis, n_agr in ((1, 0), (2, 0), (1, 1)):
        assert abs(float(sim.p_move(p, n_dis, n_agr, 0.0)) - float(sim.p_move(true, n_dis, n_agr, 0.0))) < 0.1
    # and the fitted sim reproduces the data's rates
    real = compute_stats(records)
    fitted = compute_stats(simulate(SimBackend(p, seed=2), random_schedules(1200, seed=3), 1, seed=6))
    for key in ("round-0 accuracy", "C→I all", "I→C all"):
        assert abs(real[key].rate - fitted[key].rate) < 0.05, key


def test_fit_script_end_to_end(tmp_path, capsys):
    records = simulate(SimBackend(seed=3), random_schedules(60, seed=1), 1, seed=2)
    traces = tmp_path / "traces.jsonl"
    write_records(records, traces)
    assert [r.rounds for r in read_traces(traces)] == [r.rounds for r in records]
    out, report = tmp_path / "params_synthetic_fit.json", tmp_path / "fit_report.md"
    assert map_fit.main(["--traces", str(traces), "--out", str(out), "--report", str(report),
                         "--replicates", "5"]) == 0
    params = SimBackend.from_file(out).params
    assert isinstance(params, SimParams)
    text = report.read_text()
    assert "| C→I all |" in text and "sim-v1 fitted (synthetic)" in text and "--replicates 5" in text
    assert "| I→C agree=1 |" in capsys.readouterr().out


@pytest.mark.slow
def test_collect_with_the_real_smoke_model(tmp_path):
    traces = tmp_path / "traces_real_smoke.jsonl"
    map_fit.main(["--collect", "2", "--llm", "smoke", "--max-tokens", "48", "--traces", str(traces),
                  "--out", str(tmp_path / "params_synthetic_fit.json"), "--report", str(tmp_path / "r.md"),
                  "--replicates", "3", "--fit"])
    records = read_traces(traces)
    assert len(records) == 2 and all(len(r.rounds) == 2 for r in records)
    temps = [t.temperature for r in records for t in r.rounds[1]]
    assert all(0.1 <= T <= 1.2 for T in temps)
    assert (tmp_path / "r.md").exists()
