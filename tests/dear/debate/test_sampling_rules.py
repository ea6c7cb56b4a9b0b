"""dear.debate.sampling_rules: the offline sampling rules (cot, sc-K, adaptive-sc-A) over a stored wide round 0 make
the engine protocols' decisions, for any number of starting samples; simworld.sampling_validation uses them."""

from __future__ import annotations

import zlib

import pytest

from dear.debate import DebateConfig, DebateEngine, MajorityProtocol
from dear.debate import sampling_rules as R
from dear.debate.protocols import SamplingRuleProtocol, SelfConsistencyProtocol
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
                        (SamplingRuleProtocol("adaptive-sc-2", n_agents, max_samples=6), "adaptive-sc-2"),
                        (SamplingRuleProtocol("adaptive-sc-3", n_agents, max_samples=6), "adaptive-sc-3")):
        for d in engine.run(QUESTIONS, proto):
            want = R.rule_outcome(stored[d.question.id], rule, start=n_agents)
            assert d.trace.final_score == pytest.approx(want.score), (rule, d.question.id)
            assert d.n_samples == want.used, (rule, d.question.id)


def test_simworld_reads_the_same_rules():
    from simworld import sampling_validation as V

    for name in ("Samples", "Outcome", "samples_used", "rule_outcome", "rules_for", "ROUND0_AGENTS"):
        assert getattr(V, name) is getattr(R, name), name


def confident_by_seed(request):
    """`by_seed`'s answer, with one token's log-probability that also depends only on the request."""
    from dear.llm.base import Completion, TokenLogprobs

    text = by_seed(request)
    c = -((zlib.crc32(f"c|{request.seed}".encode()) % 100) / 200)  # in [-0.5, 0]
    logprobs = TokenLogprobs((c,), ((c, c - 1.0),), (len(text.encode()),))
    return Completion(text, 20, 10, "stop", 0.01, logprobs=logprobs)


LIVE_RULES = ("adaptive-sc-2-from-1", "adaptive-sc-3-from-2", "adaptive-sc-2", "esc-2", "cisc-3", "cisc-5",
              "confident-stop", "sc-4")


@pytest.mark.parametrize("rule", LIVE_RULES)
def test_a_rule_run_live_draws_and_votes_as_its_replay(rule):
    """SamplingRuleProtocol, one fresh sample a round from the rule's start, stops where `samples_used` stops on the
    stored round 0 of 6 and scores what `rule_outcome` scores there (the weighted rules by confidence)."""
    params = R.RuleParams(tau=0.05, threshold=-0.2, agree=2)  # a threshold some first samples clear, some not
    backend = FakeBackend(confident_by_seed)
    wide = DebateEngine(backend, DebateConfig(n_agents=6, n_rounds=0, seed=5, logprobs=5)).run(
        QUESTIONS, MajorityProtocol())
    stored = {d.question.id: R.Samples.of(d.trace) for d in wide}
    assert all(s.confidence is not None and None not in s.confidence for s in stored.values())
    proto = SamplingRuleProtocol(rule, 3, max_samples=6, params=params)
    config = DebateConfig(n_agents=3, n_rounds=0, seed=5, logprobs=5, start_width=proto.start_width,
                          vote_tau=params.tau)
    used = set()
    for d in DebateEngine(backend, config).run(QUESTIONS, proto):
        want = R.rule_outcome(stored[d.question.id], rule, start=3, params=params)
        assert d.n_samples == want.used, (rule, d.question.id)
        assert d.trace.final_score == pytest.approx(want.score), (rule, d.question.id)
        assert d.trace.decision == ("confidence-weighted" if R.is_weighted(rule) else "all-answers")
        used.add(want.used)
    if rule in ("confident-stop", "adaptive-sc-2-from-1", "esc-2"):
        assert len(used) > 1, (rule, used)  # the questions exercise more than one stopping point


def test_rule_done_is_samples_used_on_a_prefix():
    s = R.Samples(("a", "b", "a", "c"), (True, False, True, False), (1, 1, 1, 1), (-0.1, -0.9, -0.3, -0.2))
    assert [R.rule_done(R.Samples(s.keys[:n], s.correct[:n], s.tokens[:n], s.confidence[:n]),
                        "adaptive-sc-2-from-1", 3) for n in (1, 2, 3)] == [False, False, True]
    assert R.rule_done(R.Samples(s.keys[:1], s.correct[:1], s.tokens[:1], s.confidence[:1]), "confident-stop",
                       params=R.RuleParams(threshold=-0.2))
    assert not R.rule_done(R.Samples(s.keys[:1], s.correct[:1], s.tokens[:1], s.confidence[:1]), "confident-stop",
                           params=R.RuleParams(threshold=-0.05))
    assert [R.rule_start(r, 3) for r in ("cot", "confident-stop", "adaptive-sc-3-from-2", "adaptive-sc-2", "esc-3",
                                         "cisc-5")] == [1, 1, 2, 3, 3, 5]
    with pytest.raises(ValueError, match="reads confidences"):
        R.rule_done(R.Samples(("a",), (True,), (1,)), "confident-stop")


def test_a_confidence_rule_needs_a_debate_that_asks_for_log_probabilities():
    proto = SamplingRuleProtocol("cisc-3", 3, max_samples=3)
    with pytest.raises(ValueError, match="DebateConfig.logprobs"):
        DebateEngine(FakeBackend(by_seed), DebateConfig(n_agents=3, n_rounds=0)).run(QUESTIONS[:1], proto)
    wrong_start = SamplingRuleProtocol("adaptive-sc-2-from-1", 3, max_samples=6)
    with pytest.raises(ValueError, match="start_width=1"):
        DebateEngine(FakeBackend(by_seed), DebateConfig(n_agents=3, n_rounds=0)).run(QUESTIONS[:1], wrong_start)


def test_the_confidence_rules_run_live_on_a_real_model(smoke_backend):
    """Confident stop and CISC-3 on the smoke model through llama.cpp (its answers are nonsense, the plumbing is
    real): every voter carries a confidence record from real log-probabilities, the vote is confidence-weighted, and
    confident stop draws one sample first."""
    from dear import tasks

    qs = tasks.load("gsm8k", "test", n=2)
    for rule, params in (("confident-stop", R.RuleParams(threshold=-0.5)), ("cisc-3", R.RuleParams(tau=0.1))):
        proto = SamplingRuleProtocol(rule, 3, max_samples=4, params=params)
        config = proto.configure(DebateConfig(n_agents=3, n_rounds=0, seed=1, max_tokens=24))
        assert config.logprobs is not None and config.start_width == (1 if rule == "confident-stop" else 3)
        for d in DebateEngine(smoke_backend, config).run(qs, proto):
            voters = d.voters("all-answers")
            assert d.trace.decision == "confidence-weighted" and d.trace.vote_tau == params.tau
            assert voters and all(R.turn_confidence(t) is not None for t in voters), rule
            assert d.n_samples == R.samples_used(R.Samples.of_turns(voters), rule, 3, params)


def test_samples_needed_is_the_start_and_the_agreement_a_rule_waits_for():
    from dear.debate.sampling_rules import samples_needed

    assert [samples_needed(r) for r in ("cot", "sc-9", "cisc-3", "esc-2", "adaptive-sc-2", "adaptive-sc-4",
                                        "adaptive-sc-3-from-1", "adaptive-sc-2-from-3", "confident-stop")] == \
        [1, 9, 3, 2, 3, 4, 3, 3, 2]
    assert samples_needed("adaptive-sc-2", start=1) == 2
