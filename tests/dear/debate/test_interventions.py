"""Interventions (DRIFTJudge, DRIFTPolicy, Regenerate, moderator + agenda): parsing, the agenda state machine,
the engine hooks they use (guidance, peer summaries, redo_last_round) and whole runs on a scripted backend."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dear import metrics
from dear.debate import DebateConfig, DebateEngine, DebateTrace, MADProtocol, RoundControl
from dear.debate.interventions import (
    AGENDA_STAGES,
    ERROR_TYPES,
    STAGE_INSTRUCTIONS,
    AgendaState,
    InterventionConfig,
    InterventionProtocol,
    moderator_action,
    parse_advice,
    parse_rating,
    parse_verdict,
    summarize_interventions,
)
from dear.llm.base import ChatRequest
from tests.dear.debate.test_debate_engine import FakeBackend, answer_text, gsm

LAYOUTS = ("single", "multiturn")


# ------------------------------------------------------------------ parsing
@pytest.mark.parametrize("text,drifted", [
    ("Verdict: DRIFT\nReason: agent 2 abandoned the correct total.", True),
    ("Verdict: NO DRIFT\nReason: same answers.", False),
    ("**Verdict:** no drift\nReason: fine", False),
    ("verdict: Drifted", True),
    ("Verdict: yes", True),
    ("Verdict: no", False),
    ("NO DRIFT. The solutions agree.", False),
    ("DRIFT - they moved to a different question", True),
    ('```json\n{"drift": true, "reason": "off topic"}\n```', True),
    ('{"drifted": false}', False),
    ('{"verdict": "NO DRIFT", "reason": "x"}', False),
])
def test_parse_verdict_accepts_reasonable_formats(text, drifted):
    v = parse_verdict(text)
    assert not v.malformed and v.drifted is drifted


def test_parse_verdict_reason():
    assert parse_verdict("Verdict: DRIFT\nReason: lost the right answer").reason == "lost the right answer"
    assert parse_verdict('{"drift": true, "reason": "r1"}').reason == "r1"


@pytest.mark.parametrize("text", ["", "   ", "I think the agents are doing fine overall.", "Verdict: maybe",
                                  '{"drift": "perhaps"}', "The discussion did not drift much", None])
def test_parse_verdict_malformed_is_no_drift(text):
    v = parse_verdict(text)
    assert v.malformed and v.drifted is False


def test_parse_rating_json_fenced_and_prose():
    r = parse_rating('Sure.\n```json\n{"relevance": 0.9, "conflict": "contradiction", "accept": true, '
                     '"summary": "says 18", "reason": "on topic"}\n```')
    assert (r.relevance, r.conflict, r.accept, r.summary, r.malformed) == (0.9, "contradiction", True, "says 18", False)
    r = parse_rating("relevance: 0.35\nconflict: Redundant")
    assert (r.relevance, r.conflict, r.accept, r.malformed) == (0.35, "redundant", None, False)
    r = parse_rating('{"relevance": "0.8", "conflict": "NONE"}')  # numeric string and upper case accepted
    assert (r.relevance, r.conflict, r.malformed) == (0.8, "none", False)


@pytest.mark.parametrize("text", ["", "looks relevant to me", '{"relevance": 1.7, "conflict": "none"}',
                                  '{"relevance": -0.1, "conflict": "none"}', '{"relevance": 0.8}', '{"relevance": "high", "conflict": "none"}',
                                  '{"relevance": 0.9, "conflict": "disagreement"}', '{"relevance": NaN}',
                                  '{"relevance": 0.9, "conflict": ', "[0.9, \"none\"]"])
def test_parse_rating_malformed_accepts(text):
    r = parse_rating(text)
    assert r.malformed
    assert moderator_action(r, 0.7) == "accept"


def test_moderator_action_thresholds():
    def rating(rel, conflict="none", accept=None):
        return parse_rating('{"relevance": %s, "conflict": "%s"%s}' % (
            rel, conflict, "" if accept is None else f', "accept": {str(accept).lower()}'))
    assert moderator_action(rating(0.69), 0.7) == "ignore"
    assert moderator_action(rating(0.7), 0.7) == "accept"
    assert moderator_action(rating(0.9, "redundant"), 0.7) == "demote"
    assert moderator_action(rating(0.9, "contradiction"), 0.7) == "accept"
    assert moderator_action(rating(0.9, accept=False), 0.7) == "demote"
    assert moderator_action(rating(0.5, "redundant"), 0.4) == "demote"  # threshold is configurable
    assert moderator_action(rating(0.5), 0.4) == "accept"


def test_parse_advice():
    a = parse_advice("Error types: Logical error, lack_of progress\nAdvice: Re-check the multiplication. Keep 18.")
    assert a.error_types == ("lack of progress", "logical error")
    assert a.text == "Re-check the multiplication. Keep 18." and not a.malformed
    assert parse_advice("Focus on the question.").text == "Focus on the question."
    assert parse_advice("   ").malformed and parse_advice("Advice:   ").malformed
    assert set(ERROR_TYPES) >= set(parse_advice(" ".join(ERROR_TYPES)).error_types)
    assert len(parse_advice("x" * 5000, max_chars=100).text) == 100


# ------------------------------------------------------------------ agenda state machine
def test_agenda_advances_after_two_quiet_rounds():
    a = AgendaState(quiet_to_advance=2, max_stage_rounds=10)
    assert a.stage == "problem_definition" and a.instruction == STAGE_INSTRUCTIONS["problem_definition"]
    assert a.record_round(new_conflict=False) is False
    assert a.record_round(new_conflict=False) is True
    assert a.stage == "argument"
    # a conflict resets the quiet count
    assert [a.record_round(c) for c in (False, True, False)] == [False, False, False]
    assert a.stage == "argument"
    assert a.record_round(False) is True and a.stage == "rebuttal"
    assert a.rounds_per_stage == {"problem_definition": 2, "argument": 4}


def test_agenda_advances_after_max_rounds_even_with_conflict():
    a = AgendaState(quiet_to_advance=2, max_stage_rounds=3)
    assert [a.record_round(True) for _ in range(3)] == [False, False, True]
    assert a.stage == "argument"


def test_agenda_stays_in_synthesis():
    a = AgendaState(quiet_to_advance=1, max_stage_rounds=1)
    stages = []
    for _ in range(7):
        stages.append(a.stage)
        a.record_round(False)
    assert stages == [*AGENDA_STAGES, "synthesis", "synthesis"]
    assert a.rounds_per_stage["synthesis"] == 3


def test_config_validation():
    with pytest.raises(ValueError, match="judge=True"):
        InterventionConfig(policy=True)
    with pytest.raises(ValueError, match="judge=True"):
        InterventionConfig(regenerate=True)
    with pytest.raises(ValueError, match="moderator=True"):
        InterventionConfig(agenda=True)
    with pytest.raises(ValueError, match="policy or regenerate"):
        InterventionConfig(judge=True, judge_prompt="basic", policy=True, regenerate=True)
    with pytest.raises(ValueError, match="relevance_threshold"):
        InterventionConfig(moderator=True, relevance_threshold=1.5)
    with pytest.raises(ValueError, match="regenerate_temperature"):
        InterventionConfig(judge=True, judge_prompt="basic", regenerate=True, regenerate_temperature=0.0)
    with pytest.raises(ValueError, match="no intervention"):
        InterventionProtocol(MADProtocol(), InterventionConfig())


# ------------------------------------------------------------------ engine hooks
@pytest.mark.parametrize("layout", LAYOUTS)
def test_guidance_reaches_the_exchange_prompt_and_stays_in_multiturn_history(layout):
    be = FakeBackend()
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=2, layout=layout))
    (d,) = eng.start([gsm(0)])
    full = ~np.eye(2, dtype=bool)
    eng.step([d], [RoundControl(full, 0.7, 0.9, guidance=("NOTE-FOR-A0", None))])
    r1 = be.calls[-1]
    assert "NOTE-FOR-A0" in r1[0].messages[-1].content and "NOTE-FOR-A0" not in r1[1].messages[-1].content
    # the format instruction stays last
    assert r1[0].messages[-1].content.rstrip().endswith(r1[1].messages[-1].content.rstrip().splitlines()[-1])
    assert d.trace.rounds[1][0].guidance == "NOTE-FOR-A0" and d.trace.rounds[1][1].guidance is None
    eng.step([d], [RoundControl(full, 0.7, 0.9)])
    r2 = be.calls[-1]
    whole = "\n".join(m.content for m in r2[0].messages)
    assert ("NOTE-FOR-A0" in whole) is (layout == "multiturn")  # the earlier user turn is replayed verbatim
    if layout == "multiturn":
        assert r2[0].messages[: len(r1[0].messages)] == r1[0].messages  # prefix unchanged: KV cache reuse holds


def test_round_control_guidance_validation():
    with pytest.raises(ValueError, match="guidance"):
        RoundControl(~np.eye(3, dtype=bool), 0.7, 0.9, guidance=("a", "b"))
    with pytest.raises(ValueError, match="guidance"):
        RoundControl(~np.eye(2, dtype=bool), 0.7, 0.9, guidance=("a", 3))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_demoted_answer_shows_peers_only_its_summary(layout):
    be = FakeBackend()
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=1, layout=layout))
    (d,) = eng.start([gsm(0)])
    d.last_turns[1].peer_summary = "agent two says eighteen"
    eng.step([d], [RoundControl.full(2)])
    to_a0 = "\n".join(m.content for m in be.calls[-1][0].messages)
    to_a1 = "\n".join(m.content for m in be.calls[-1][1].messages)
    assert "agent two says eighteen" in to_a0 and "reasoning-of-agent-1-round-0" not in to_a0
    assert "reasoning-of-agent-1-round-0" in to_a1 and "agent two says eighteen" not in to_a1  # own answer intact


def test_redo_last_round_drops_and_reruns_once_with_fresh_seeds():
    be = FakeBackend(lambda r: answer_text(r.metadata["agent"], r.metadata["round"],
                                           "18" if r.metadata.get("attempt") else "7"))
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=1))
    (d,) = eng.start([gsm(0)])
    eng.step([d], [RoundControl.full(3)])
    assert d.done and d.trace.final_answer == "7"
    first = d.trace.rounds[1]
    tokens_before = d.trace.prompt_tokens + d.trace.completion_tokens
    dropped = sum(t.prompt_tokens + t.completion_tokens for t in first)
    eng.redo_last_round([d], [RoundControl.full(3, temperature=1.0)])
    assert len(d.trace.rounds) == 2 and d.trace.discarded_rounds == [first]
    new = d.trace.rounds[1]
    assert all(t.attempt == 1 and t.temperature == 1.0 for t in new)
    assert [t.seed for t in new] != [t.seed for t in first]
    assert d.done and d.trace.final_answer == "18" and d.trace.final_correct
    kept = sum(t.prompt_tokens + t.completion_tokens for r in d.trace.rounds for t in r)
    assert d.trace.total_tokens == kept == tokens_before - dropped + sum(t.prompt_tokens + t.completion_tokens
                                                                         for t in new)
    assert d.trace.extra_tokens == dropped and d.trace.extra_calls[-1].kind == "regenerate"
    with pytest.raises(ValueError, match="already redone once"):
        eng.redo_last_round([d], [RoundControl.full(3)])
    rt = DebateTrace.from_json(d.trace.to_json())  # the new fields survive serialisation
    assert rt.discarded_rounds[0][0].text == first[0].text and rt.extra_tokens == d.trace.extra_tokens


def test_redo_refuses_round0():
    eng = DebateEngine(FakeBackend(), DebateConfig(n_agents=2, n_rounds=1))
    (d,) = eng.start([gsm(0)])
    with pytest.raises(ValueError, match="round 0"):
        eng.redo_last_round([d], [RoundControl.full(2)])


# ------------------------------------------------------------------ whole runs on a scripted backend
class Script:
    """Debaters answer `answers[(round, attempt)]`; judge / policy / moderator replies are scripted per round."""

    def __init__(self, answers=None, verdicts=None, advice="Error types: logical error\nAdvice: ADVICE-XYZ",
                 ratings=None):
        self.answers = answers or {}
        self.verdicts = verdicts or {}
        self.advice = advice
        self.ratings = ratings or {}

    def __call__(self, r: ChatRequest) -> str:
        kind, rnd = r.metadata.get("intervention"), r.metadata["round"]
        if kind == "judge":
            return self.verdicts.get(rnd, "Verdict: NO DRIFT\nReason: fine")
        if kind == "policy":
            return self.advice
        if kind == "moderator":
            return self.ratings.get((rnd, r.metadata["rated_agent"]), '{"relevance": 0.9, "conflict": "none"}')
        return answer_text(r.metadata["agent"], rnd, self.answers.get((rnd, r.metadata.get("attempt", 0)), "18"))


def debater_calls(be: FakeBackend) -> list[list[ChatRequest]]:
    return [b for b in be.calls if "intervention" not in b[0].metadata]


def extra_calls(be: FakeBackend, kind: str) -> list[ChatRequest]:
    return [r for b in be.calls for r in b if r.metadata.get("intervention") == kind]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_policy_advice_reaches_next_round_prompts(layout):
    be = FakeBackend(Script(verdicts={1: "Verdict: DRIFT\nReason: agents dropped 18"}))
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=3, layout=layout))
    proto = InterventionProtocol(MADProtocol(3, 3), InterventionConfig(judge=True, judge_prompt="basic", policy=True))
    (d,) = proto.run(eng, [gsm(0)])
    rounds = debater_calls(be)
    assert len(rounds) == 4
    assert all("ADVICE-XYZ" not in r.messages[-1].content for r in rounds[1])
    assert all("ADVICE-XYZ" in r.messages[-1].content and "logical error" in r.messages[-1].content
               for r in rounds[2])
    assert all("ADVICE-XYZ" not in r.messages[-1].content for r in rounds[3])  # one round only
    assert len(extra_calls(be, "judge")) == 3 and len(extra_calls(be, "policy")) == 1
    # the feedback call saw the judge's reason and the taxonomy
    assert "agents dropped 18" in extra_calls(be, "policy")[0].messages[-1].content
    assert "knowledge gap" in extra_calls(be, "policy")[0].messages[-1].content
    s = summarize_interventions([d.trace])
    assert (s.judge_verdicts, s.judge_flagged, s.policy_advice) == (3, 1, 1)
    assert s.tokens["judge"] > 0 and s.debater_tokens == d.trace.total_tokens
    assert d.trace.extra_tokens == sum(s.tokens.values())


def test_policy_not_called_after_the_final_round_and_malformed_verdict_counted():
    be = FakeBackend(Script(verdicts={1: "the agents seem fine", 2: "Verdict: DRIFT\nReason: x"}))
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=2))
    proto = InterventionProtocol(MADProtocol(2, 2), InterventionConfig(judge=True, judge_prompt="basic", policy=True))
    (d,) = proto.run(eng, [gsm(0)])
    assert extra_calls(be, "policy") == []
    s = summarize_interventions([d.trace])
    assert (s.judge_verdicts, s.judge_flagged, s.judge_malformed) == (2, 1, 1)


def test_judge_sees_previous_and_current_solutions():
    be = FakeBackend(Script(answers={(1, 0): "99"}))
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=1))
    InterventionProtocol(MADProtocol(2, 1), InterventionConfig(judge=True, judge_prompt="basic")).run(eng, [gsm(0)])
    (req,) = extra_calls(be, "judge")
    text = req.messages[-1].content
    assert "Solutions in round 0" in text and "Solutions in round 1" in text
    assert "\\boxed{18}" in text and "\\boxed{99}" in text and "Verdict: DRIFT or NO DRIFT" in text
    assert req.temperature == 0.0 and req.session is None


def test_regenerate_redoes_a_flagged_round_exactly_once():
    # the judge flags every round, also the regenerated one: each round is still redone only once
    script = Script(answers={(1, 0): "7", (1, 1): "18", (2, 0): "7", (2, 1): "18"},
                    verdicts={1: "Verdict: DRIFT\nReason: a", 2: "Verdict: DRIFT\nReason: b"})
    be = FakeBackend(script)
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, temperature0=0.0))
    proto = InterventionProtocol(MADProtocol(3, 2, temperature=0.0),
                                 InterventionConfig(judge=True, judge_prompt="basic", regenerate=True, regenerate_temperature=0.8))
    (d,) = proto.run(eng, [gsm(0)])
    rounds = debater_calls(be)
    assert [b[0].metadata["round"] for b in rounds] == [0, 1, 1, 2, 2]
    assert [b[0].metadata["attempt"] for b in rounds] == [0, 0, 1, 0, 1]
    assert all(r.temperature == 0.8 for b in rounds if b[0].metadata["attempt"] for r in b)
    assert len(extra_calls(be, "judge")) == 2  # the redone rounds are not judged again
    assert [t.attempt for r in d.trace.rounds for t in r] == [0] * 3 + [1] * 3 + [1] * 3
    assert len(d.trace.discarded_rounds) == 2 and d.trace.final_answer == "18"
    s = summarize_interventions([d.trace])
    assert s.regenerated_rounds == 2 and s.tokens["regenerate"] == sum(
        t.prompt_tokens + t.completion_tokens for r in d.trace.discarded_rounds for t in r)


def test_regenerate_without_flags_changes_nothing():
    be = FakeBackend(Script())
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=2))
    (d,) = InterventionProtocol(MADProtocol(2, 2), InterventionConfig(judge=True, judge_prompt="basic", regenerate=True)).run(eng, [gsm(0)])
    be_plain = FakeBackend(Script())
    (p,) = DebateEngine(be_plain, DebateConfig(n_agents=2, n_rounds=2)).run([gsm(0)], MADProtocol(2, 2))
    assert [[r.messages for r in b] for b in debater_calls(be)] == [[r.messages for r in b] for b in be_plain.calls]
    assert d.trace.total_tokens == p.trace.total_tokens and d.trace.discarded_rounds == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_moderator_ignores_and_demotes(layout):
    ratings = {(0, 1): '{"relevance": 0.2, "conflict": "none", "reason": "off topic"}',
               (0, 2): '{"relevance": 0.9, "conflict": "redundant", "summary": "SUMMARY-OF-A2"}'}
    be = FakeBackend(Script(ratings=ratings))
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, layout=layout))
    proto = InterventionProtocol(MADProtocol(3, 2), InterventionConfig(moderator=True))
    (d,) = proto.run(eng, [gsm(0)])
    r1 = d.trace.rounds[1]
    assert r1[0].peers == [2] and r1[2].peers == [0] and r1[1].peers == [0, 2]  # agent 1 (ignored) hidden
    p0 = debater_calls(be)[1][0].messages[-1].content
    assert "SUMMARY-OF-A2" in p0 and "reasoning-of-agent-2-round-0" not in p0
    assert "reasoning-of-agent-1-round-0" not in p0
    assert d.trace.rounds[2][0].peers == [1, 2]  # round-1 answers were all accepted
    assert len(extra_calls(be, "moderator")) == 6  # rounds 0 and 1, three answers each; the last is not rated
    s = summarize_interventions([d.trace])
    assert s.moderator_rated == 6 and s.moderator_actions == {"accept": 4, "ignore": 1, "demote": 1}
    assert math.isclose(s.rejection_rate, 2 / 6)


def test_moderator_with_agenda_injects_stages_and_advances():
    # round 1: a contradiction (no advance after 1 round); round 2: quiet -> 2 rounds in stage -> advance
    ratings = {(1, 0): '{"relevance": 0.9, "conflict": "contradiction"}'}
    be = FakeBackend(Script(ratings=ratings))
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=4))
    cfg = InterventionConfig(moderator=True, agenda=True, agenda_quiet_rounds=2, agenda_max_stage_rounds=2)
    (d,) = InterventionProtocol(MADProtocol(2, 4), cfg).run(eng, [gsm(0)])
    stages = []
    for b in debater_calls(be)[1:]:
        found = [s for s in AGENDA_STAGES if STAGE_INSTRUCTIONS[s] in b[0].messages[-1].content]
        stages.append(found)
    assert stages == [["problem_definition"], ["problem_definition"], ["argument"], ["argument"]]
    s = summarize_interventions([d.trace])
    assert s.stage_rounds == {"problem_definition": 2, "argument": 2}
    # the moderator is told the stage from round 1 on
    mods = extra_calls(be, "moderator")
    assert "agenda stage" not in mods[0].messages[-1].content.lower()
    assert STAGE_INSTRUCTIONS["problem_definition"] in mods[2].messages[-1].content


def test_interventions_survive_a_failing_judge_backend():
    class Broken(FakeBackend):
        def generate(self, requests):
            raise RuntimeError("judge server down")

    be = FakeBackend(Script())
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=1))
    proto = InterventionProtocol(MADProtocol(2, 1), InterventionConfig(judge=True, judge_prompt="basic", policy=True), backend=Broken())
    (d,) = proto.run(eng, [gsm(0)])
    assert d.done and not d.failed
    (call,) = [c for c in d.trace.extra_calls if c.kind == "judge"]
    assert call.result["malformed"] and "judge server down" in call.error


def test_wraps_any_protocol_with_per_debate_controls():
    """The wrapper only needs n_rounds + controls(debates): here a protocol that gives each debate its own mask."""

    class PerDebate:
        name, n_rounds = "custom", 1

        def controls(self, debates):
            return [RoundControl(np.array([[False, k % 2 == 0], [True, False]]), 0.7, 0.9)
                    for k, _ in enumerate(debates)]

    be = FakeBackend(Script())
    eng = DebateEngine(be, DebateConfig(n_agents=2, n_rounds=1))
    ds = InterventionProtocol(PerDebate(), InterventionConfig(judge=True, judge_prompt="basic")).run(eng, [gsm(0), gsm(1)])
    assert [d.trace.rounds[1][0].peers for d in ds] == [[1], []]
    assert ds[0].trace.protocol == "custom+judge"
    assert len(extra_calls(be, "judge")) == 2 and len([b for b in be.calls if "intervention" in b[0].metadata]) == 1


# ------------------------------------------------------------------ judge quality metrics
def test_detection_counts_and_rates():
    det = metrics.detection([True, True, False, False, False, True], [True, False, False, False, True, True])
    assert (det.tp, det.fp, det.tn, det.fn) == (2, 1, 2, 1)
    assert det.precision == 2 / 3 and det.recall == 2 / 3 and det.specificity == 2 / 3 and det.accuracy == 4 / 6
    none = metrics.detection([False, False], [False, False])
    assert math.isnan(none.precision) and math.isnan(none.recall) and none.specificity == 1.0
    with pytest.raises(ValueError, match="2 predictions for 3"):
        metrics.detection([True, False], [True, False, True])


def test_focus_drift_label():
    assert metrics.focus_drift_label(["18", "18", "7"], [True, True, False], ["7", "7", "18"], [False, False, True])
    assert not metrics.focus_drift_label(["7", "7", "18"], [False, False, True], ["18", "18", "18"], [True] * 3)
    assert not metrics.focus_drift_label(["7", "7"], [False, False], ["9", "9"], [False, False])  # 0 -> 0
    # a tie halves the score: 1 -> 0.5 is drift
    assert metrics.focus_drift_label(["18", "18"], [True, True], ["18", "7"], [True, False])
