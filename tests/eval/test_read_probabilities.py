"""eval.read_probabilities: a policy's reads and read probabilities by profile, rebuilt from an evaluation's
regulator log (sim backend, a mixed pool of profiles)."""

from __future__ import annotations

import json

import pytest

from dear.export import export_policy
from dear.policy import JointPolicy, PolicyConfig
from eval import read_probabilities
from eval import run as eval_run


def _policy(tmp_path, name: str, bias: float):
    config = PolicyConfig(n_agents=3, profiles=("cot", "direct"), selection_bias_init=bias)
    return export_policy(JointPolicy(config), tmp_path / name, encoder="hashing", training={"n_rounds": 2, "llm": "sim"})


def test_the_rates_come_back_from_the_log_and_only_for_the_policy_that_ran(tmp_path):
    reads_all = _policy(tmp_path, "p", bias=3.0)  # every P(read) near sigmoid(3) = 0.95
    out = tmp_path / "res"
    eval_run.main(["--benchmarks", "synthetic", "--n", "3", "--llm", "sim", "--methods", "dear", "--seed", "0",
                   "--out", str(out), "--batch", "3", "--n-boot", "50", "--no-progress", "--checkpoint",
                   str(reads_all), "--agent-profiles", "cot,cot,direct"])
    rates = read_probabilities.main([str(out), "--json", str(tmp_path / "rates.json")])
    assert {(x.round, x.reader, x.read) for x in rates} == {
        (r, a, b) for r in (1, 2) for a, b in [("sim:cot", "sim:cot"), ("sim:cot", "sim:direct"),
                                               ("sim:direct", "sim:cot")]}
    assert sum(x.pairs for x in rates) == 3 * 2 * 6  # debates x rounds x ordered pairs
    assert all(x.rate == 1.0 and 0.9 < x.probability < 1.0 for x in rates)
    assert json.loads((tmp_path / "rates.json").read_text())[0]["rate"] == 1.0

    other = _policy(tmp_path, "q", bias=-3.0)
    with pytest.raises(ValueError, match="are not the ones"):
        read_probabilities.main([str(out), "--checkpoint", str(other)])
    log = out / "traces" / "synthetic" / "dear.regulator.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    rows[1]["decisions"][0]["mask"][0][1] = False  # a mask the policy did not choose
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"dear.regulator.jsonl:2: round 1: the logged mask is not the mode"):
        read_probabilities.main([str(out)])


def test_a_tiny_read_probability_does_not_print_as_zero():
    from dear.read_rates import probability_cell

    assert probability_cell(4.25e-05) == "4.3e-05" and probability_cell(0.0) == "0.000"
    assert probability_cell(0.95) == "0.950" and probability_cell(0.001) == "0.001"
