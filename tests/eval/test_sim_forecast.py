"""eval.sim_forecast: a real evaluation's settings replayed in a fitted world, compared method by method and step rate
by step rate — on a scripted "real" directory, and on the committed real mixed-pool evaluation with the fitted
mixed world it forecasts."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from dear import tasks
from dear.llm.base import Backend, ChatRequest, Completion
from eval import run as eval_run
from eval import sim_forecast
from tests import ROOT

WORLD = ROOT / "worlds" / "gsm8k-mixed"
PARAMS, BANK = WORLD / "sim_params_synthetic_texts.json", WORLD / "text_bank.json.gz"
REAL_MIXED = ROOT / "results" / "eval-gsm8k-mixed-n60"


class ScriptedPool(Backend):
    """A stand-in for a real mixed pool on GSM8K: the `cot` agents answer the gold, except agent 1 on every other
    question; the `direct` agent answers 3 in round 0 and the gold once it has read agent 0."""

    model_id = "scripted-real"
    synthetic = False

    def __init__(self, gold: dict[str, str]):
        self.gold = gold

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        out = []
        for r in requests:
            m = r.metadata
            gold = self.gold[m["question_id"]]
            if m.get("style") == "direct":
                read_agent0 = m["round"] > 0 and 0 in (m.get("peers") or [])
                answer = gold if read_agent0 or m["round"] > 0 and gold in (m.get("peer_answers") or []) else "3"
            else:
                answer = gold if m["agent"] == 0 or int(m["question_id"].split("-")[-1]) % 2 else "1"
            text = f"Reasoning.\nFinal answer: \\boxed{{{answer}}}"
            out.append(Completion(text, 20, 8, "stop", 0.0))
        return out


@pytest.fixture(scope="module")
def scripted_real(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("real")
    gold = {q.id: q.gold for q in tasks.load("gsm8k", n=6, seed=0)}
    eval_run.main(["--benchmarks", "gsm8k", "--n", "6", "--llm", "local", "--agent-profiles",
                   "local:cot,local:cot,local:direct", "--methods", "cot,majority,mad,read-strongest", "--n-boot", "100",
                   "--max-tokens", "384", "--out", str(out), "--no-progress"], backend=ScriptedPool(gold))
    return out


def test_profiles_move_to_the_sim_backend_and_lose_it_in_the_comparison():
    assert sim_forecast.sim_profile("local:direct:64") == "sim:direct:64"
    assert sim_forecast.sim_profile("openai:http://h:1/v1#m:cot") == "sim:cot"
    assert sim_forecast.style_of("local:direct+local:cot") == "cot+direct"
    assert sim_forecast.style_of("sim:cot") == "cot" and sim_forecast.style_of("nobody") == "nobody"
    argv = sim_forecast.sim_argv({"agent_profiles": ["local:cot", "local:direct:64"], "n_agents": 2, "seed": 3,
                                  "n_rounds": 1, "max_tokens": 384, "layout": "multiturn"}, ["majority"], 20, Path("o"),
                                 PARAMS, BANK)
    assert argv[argv.index("--agent-profiles") + 1] == "sim:cot,sim:direct:64"
    assert argv[argv.index("--llm") + 1] == "sim" and argv[argv.index("--benchmarks") + 1] == "synthetic"
    assert argv[argv.index("--seed") + 1] == "3" and argv[argv.index("--n-rounds") + 1] == "1"
    assert argv[argv.index("--sim-params") + 1] == str(PARAMS) and argv[argv.index("--sim-text-bank") + 1] == str(BANK)


def test_a_forecast_sets_every_rule_method_and_step_rate_beside_the_real_ones(scripted_real, tmp_path):
    record = sim_forecast.forecast(scripted_real, PARAMS, BANK, None, 24, tmp_path / "f", n_boot=100)
    methods = record["methods"]
    assert set(methods) == {"cot", "majority", "mad", "read-strongest"}
    assert methods["majority"]["real"]["minus_majority"] == 0.0 and methods["majority"]["real"]["n"] == 6
    assert methods["cot"]["sim_synthetic"]["n"] == 24
    # the scripted pool: agent 0 always right, agent 1 right on odd questions, so the real majority is right 100 %
    assert methods["cot"]["real"]["accuracy"] == 1.0
    sim_run = json.loads((tmp_path / "f" / "sim" / "run.json").read_text())
    assert sim_run["synthetic"] and sim_run["settings"]["agent_profiles"] == ["sim:cot", "sim:cot", "sim:direct"]
    assert sim_run["settings"]["backend_options"] == {"params_file": str(PARAMS), "text_bank": str(BANK)}
    rates = {(r["method"], r["profile"], r["read"], r["rate"]): r for r in record["step_rates"]}
    direct = rates["read-strongest", "direct", "cot", "I→C"]  # the hand rule: the direct agent reads both cot agents
    assert direct["real_n"] == direct["real_k"] == 6 and direct["sim_n"] > 0  # wrong in round 0, then the gold
    md = (tmp_path / "f" / "sim_forecast.md").read_text()
    assert "SYNTHETIC" in md and "sim acc % (synthetic)" in md and "| Everyone reads the strongest |" in md
    # the same command resumes the sim's directory instead of running it again
    again = sim_forecast.forecast(scripted_real, PARAMS, BANK, None, 24, tmp_path / "f", n_boot=100)
    assert again["methods"] == record["methods"]


def test_bad_input_names_what_is_wrong(scripted_real, tmp_path):
    with pytest.raises(ValueError, match=r"--methods: dear not among .* rule methods \(cot, majority, mad, read-strongest\)"):
        sim_forecast.forecast(scripted_real, PARAMS, BANK, ["dear"], 10, tmp_path / "x")
    with pytest.raises(ValueError, match="--params: no such file"):
        sim_forecast.forecast(scripted_real, tmp_path / "none.json", None, None, 10, tmp_path / "x")
    with pytest.raises(ValueError, match="no run.json"):
        sim_forecast.forecast(tmp_path, PARAMS, BANK, None, 10, tmp_path / "x")


@pytest.mark.skipif(not (REAL_MIXED / "run.json").is_file(), reason="the committed mixed-pool evaluation is absent")
def test_the_fitted_mixed_world_forecast_reads_the_committed_real_evaluation(tmp_path):
    """The real part: the committed real evaluation of the mixed pool and the fitted mixed world's files."""
    record = sim_forecast.forecast(REAL_MIXED, PARAMS, BANK, ["majority", "read-strongest"], 30, tmp_path / "f",
                                   n_boot=200)
    with (REAL_MIXED / "summary.csv").open() as f:
        committed = {r["method"]: r for r in csv.DictReader(f)}
    for method in ("majority", "read-strongest"):
        assert record["methods"][method]["real"]["accuracy"] == pytest.approx(float(committed[method]["accuracy"]),
                                                                              abs=1e-6)
    assert record["methods"]["read-strongest"]["sim_synthetic"]["n"] == 30
    assert any(r["profile"] == "direct" and r["read"] == "cot" for r in record["step_rates"])


def test_eval_run_gives_the_world_files_to_the_sim_backend_only(tmp_path):
    """--sim-params / --sim-text-bank: the fitted world answers (its skills differ from the built-in world's), and
    bad use names the flag."""
    from eval.run import options_for

    opts = {"params_file": "p.json", "text_bank": "b.gz", "n_parallel": 4}
    assert options_for("sim", "local", opts) == {"params_file": "p.json", "text_bank": "b.gz"}
    assert options_for("local", "local", opts) == {"n_parallel": 4}
    assert options_for("openai:http://h/v1", "local", opts) == {}
    common = ["--benchmarks", "synthetic", "--n", "12", "--llm", "sim", "--methods", "cot", "--n-boot", "50",
              "--no-progress", "--agent-profiles", "sim:cot,sim:cot,sim:direct"]
    fitted = eval_run.main([*common, "--sim-params", str(PARAMS), "--out", str(tmp_path / "fitted")])
    built_in = eval_run.main([*common, "--out", str(tmp_path / "built-in")])
    assert fitted[0].correct_by_question != built_in[0].correct_by_question
    with pytest.raises(ValueError, match="--sim-params: no such file"):
        eval_run.main([*common, "--sim-params", str(tmp_path / "none.json"), "--out", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="--sim-text-bank sets the sim backend's world, but no agent runs on --llm sim"):
        eval_run.main(["--benchmarks", "gsm8k", "--n", "2", "--llm", "local", "--methods", "cot", "--sim-text-bank",
                       str(BANK), "--out", str(tmp_path / "y")])
