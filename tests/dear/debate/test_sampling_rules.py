"""dear.debate.sampling_rules: the offline sampling rules (cot, sc-K, adaptive-sc-A) over a stored wide round 0 make
the engine protocols' decisions, for any number of starting samples; simworld.sampling_validation uses them."""

from __future__ import annotations

import pytest

from dear.debate import DebateConfig, DebateEngine, MajorityProtocol
from dear.debate import sampling_rules as R
from dear.debate.protocols import AdaptiveSCProtocol, SelfConsistencyProtocol
from tests.dear.debate.test_baselines_as_settings import QUESTIONS, by_seed
from tests.dear.debate.test_debate_engine import FakeBackend


def _samples(keys):
    return R.Samples(tuple(keys), tuple(k == "a" for k in keys), tuple(range(1, len(keys) + 1)))


def test_adaptive_rules_start_from_the_debates_agents():
    s = _samples(["a", "b", "b", "c", "a", "a"])
    assert R.samples_used(s, "adaptive-sc-2") == 3  # the default start, 3: b and b already agree
    assert R.samples_used(s, "adaptive-sc-2", start=2) == 3  # a, b, then the 3rd repeats b
    assert R.samples_used(s, "adaptive-sc-3", start=2) == 6
    assert R.rule_outcome(s, "adaptive-sc-3", start=2) == R.Outcome(1.0, 6, 21)
    assert R.samples_used(s, "adaptive-sc-2", start=9) == 6  # never more than there are
    assert R.samples_used(s, "sc-4", start=2) == 4 and R.samples_used(s, "cot", start=2) == 1
    with pytest.raises(ValueError, match="unknown rule 'sc-x'"):
        R.samples_used(s, "sc-x")


@pytest.mark.parametrize("n_agents", [2, 3])
def test_the_rules_are_the_engines_decisions(n_agents):
    """Against a backend whose answer depends only on the request, fresh sample k of a V-agent debate is round-0
    agent k of a 6-agent one: SC and adaptive SC score, and count samples, as the rules do on that round 0."""
    backend = FakeBackend(by_seed)
    wide = DebateEngine(backend, DebateConfig(n_agents=6, n_rounds=0, seed=5)).run(QUESTIONS, MajorityProtocol())
    stored = {d.question.id: R.Samples.of(d.trace) for d in wide}
    assert stored[QUESTIONS[0].id] == R.Samples.of_turns(wide[0].trace.rounds[0])
    engine = DebateEngine(backend, DebateConfig(n_agents=n_agents, n_rounds=0, seed=5))
    for proto, rule in ((SelfConsistencyProtocol(n_agents, 6), "sc-6"),
                        (AdaptiveSCProtocol(n_agents, agree=2, max_samples=6), "adaptive-sc-2"),
                        (AdaptiveSCProtocol(n_agents, agree=3, max_samples=6), "adaptive-sc-3")):
        for d in engine.run(QUESTIONS, proto):
            want = R.rule_outcome(stored[d.question.id], rule, start=n_agents)
            assert d.trace.final_score == pytest.approx(want.score), (rule, d.question.id)
            assert d.n_samples == want.used, (rule, d.question.id)


def test_simworld_reads_the_same_rules():
    from simworld import sampling_validation as V

    for name in ("Samples", "Outcome", "samples_used", "rule_outcome", "rules_for", "ROUND0_AGENTS"):
        assert getattr(V, name) is getattr(R, name), name
