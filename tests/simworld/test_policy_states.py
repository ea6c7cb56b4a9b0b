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
