"""simworld.policy_states: an extended policy's fresh samples, rounds and accuracy by round-0 agreement, on
stored traces and in a simulated world."""

from __future__ import annotations

import pytest

from dear.debate.trace import write_jsonl
from simworld import policy_states
from tests import ROOT
from tests.eval.test_eval_extended_policy import extended_export


def test_by_state_counts_fresh_samples_after_round0(tmp_path):
    policy = extended_export(tmp_path / "policy")  # agent 2 draws a fresh sample in every round that runs
    traces = policy_states.sim_traces(policy, ROOT / "configs" / "sim.yaml", 12, seed=3)
    rows = policy_states.by_state(traces)
    assert sum(r.debates for r in rows) == 12 and {r.state for r in rows} <= set(policy_states.STATES)
    for r in rows:
        group = [t for t in traces if policy_states.agreement_state(t) == r.state]
        assert r.fresh == pytest.approx(sum(x.fresh for t in group for turns in t.rounds[1:] for x in turns)
                                        / len(group))
        assert r.fresh == pytest.approx(r.rounds)  # one fresh sample per exchange round the play ran
        assert 0 <= r.accuracy <= 1
    unanimous = [r for r in rows if r.state == "unanimous"]
    assert not unanimous or unanimous[0].rounds == 0  # the play stops once the leader holds every answer
    write_jsonl(traces, tmp_path / "dear.jsonl")
    out = tmp_path / "states.md"
    assert policy_states.main(["--traces", str(tmp_path / "dear.jsonl"), "--out", str(out)]) == 0
    assert out.read_text().count("| real |") == len(rows)
    with pytest.raises(FileNotFoundError, match="no such file"):
        policy_states.main(["--traces", str(tmp_path / "missing.jsonl")])


def test_the_baselines_by_state_real_beside_simulated(tmp_path):
    """The fixed methods' accuracy per round-0 state: SC draws its 9 samples, adaptive SC stops at two agreeing,
    MAD revises; stored traces (the real side) are read per method file, and the table has both sides."""
    sim = policy_states.sim_baselines(ROOT / "configs" / "sim.yaml", 12, seed=3)
    assert set(sim) == set(policy_states.BASELINES)
    assert all(len(t.rounds[0]) == 3 for t in sim["mad"])
    assert all(sum(len([x for x in turns if not x.silent]) for turns in t.rounds) == 9 for t in sim["sc"])
    for t in sim["adaptive-sc-2"]:
        keys = [a.answer_key for a in t.rounds[0] if a.answer_key is not None]
        if len(keys) > len(set(keys)):  # two of round 0 agree: no fresh sample
            assert len(t.rounds) == 1
    # the same debates start from the same round 0 in every protocol
    assert [[a.answer_key for a in t.rounds[0]] for t in sim["mad"]] == [
        [a.answer_key for a in t.rounds[0][:3]] for t in sim["sc"]]
    for method in ("majority", "mad"):
        write_jsonl(sim[method], tmp_path / f"{method}.jsonl")
    real = policy_states.real_baselines(tmp_path)
    assert set(real) == {"majority", "mad"}
    acc = policy_states.accuracy_by_state(real["mad"])
    assert sum(n for n, _ in acc.values()) == 12
    lines = policy_states.baseline_table(real, sim)
    assert sum("| real |" in line for line in lines) == 2 and sum("| sim (synthetic) |" in line for line in lines) == 4
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds none of"):
        policy_states.real_baselines(tmp_path / "empty")
