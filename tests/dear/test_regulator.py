"""Regulator: texts -> beliefs/state, and RegulatedProtocol driving real engine debates."""

import numpy as np
import pytest
import torch

from dear.debate.engine import Debate, DebateConfig, DebateEngine
from dear.debate.trace import AgentTurn, DebateTrace
from dear.evidence import make_encoder
from dear.policy import JointPolicy, PolicyConfig, pairs_to_mask, selection_observation
from dear.regulator import RegulatedProtocol, make_controls, observe, state_dim
from dear.sim import SimBackend
from dear.tasks.types import Question


def fake_debate(reasonings, conclusions, keys, round_=1, n_rounds=2) -> Debate:
    v = len(keys)
    q = Question(id="q1", task="t", question="What is 2+2?", gold="4", kind="numeric")
    trace = DebateTrace(
        debate_id="d1",
        question_id="q1",
        task="t",
        question=q.question,
        gold="4",
        kind="numeric",
        model_ids=["m"] * v,
    )
    turns = [
        AgentTurn(
            agent=i,
            round=round_,
            messages=[],
            text="",
            reasoning=reasonings[i],
            conclusion=conclusions[i],
            answer=keys[i],
            answer_key=keys[i],
            correct=keys[i] == "4",
            grader="numeric",
            temperature=0.7,
            top_p=0.9,
            seed=0,
            peers=[],
            prompt_tokens=1,
            completion_tokens=1,
            finish_reason="stop",
            latency_s=0.0,
        )
        for i in range(v)
    ]
    trace.add_round(turns)
    return Debate(
        question=q, debate_id="d1", seed=0, n_rounds=n_rounds, trace=trace, vote_seed=0, round=round_
    )


def test_observe_isolated_agent_is_most_uncertain_and_state_features():
    enc = make_encoder("hashing")
    same = "add two and two to get four apples in the basket"
    d = fake_debate(
        [same, same, "multiply the seven oranges by three crates giving twenty one"],
        ["The answer is 4.", "The answer is 4.", "The answer is 21."],
        ["4", "4", "21"],
    )
    obs = observe([d, d], enc)
    v = 3
    assert obs.b.shape == (2, v, v) and obs.u.shape == (2, v)
    assert torch.allclose(obs.b.sum(-1) + obs.u, torch.ones(2, v), atol=1e-6)
    assert torch.all(torch.diagonal(obs.b, dim1=1, dim2=2) == 0)
    assert int(obs.u[0].argmax()) == 2  # the isolated agent is the most uncertain (docs/DESIGN.md §3 example)
    assert torch.equal(obs.selection_obs, selection_observation(obs.b, obs.u))
    assert obs.state.shape == (2, state_dim(v))
    extra = obs.state[0, v * v + v :]
    # round 1 of 2, plurality share 2/3, 2 distinct answers of 3, no missing answer, agrees = [1, 1, 0]
    assert torch.allclose(extra, torch.tensor([0.5, 2 / 3, 2 / 3, 0.0, 1.0, 1.0, 0.0]))
    assert torch.all((obs.state >= 0) & (obs.state <= 1))


def test_observe_missing_answers_and_blank_text():
    enc = make_encoder("hashing")
    d = fake_debate(["x y", " ", "z w"], ["a", "b", ""], [None, None, "5"], round_=0)
    obs = observe([d], enc)
    extra = obs.state[0, 12:]
    assert torch.allclose(extra, torch.tensor([0.0, 1 / 3, 1 / 3, 2 / 3, 0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="no debates"):
        observe([], enc)


def test_make_controls_roundtrip():
    mask = pairs_to_mask(torch.tensor([[1, 0, 1, 1, 0, 0]], dtype=torch.float32), 3)
    ctl = make_controls(mask, torch.tensor([[0.3, 0.5, 0.7]]), torch.tensor([[0.9, 0.8, 1.0]]))[0]
    assert ctl.mask.tolist() == [[False, True, False], [True, False, True], [False, False, False]]
    assert np.allclose(ctl.temperature, [0.3, 0.5, 0.7]) and np.allclose(ctl.top_p, [0.9, 0.8, 1.0])


def _synthetic_questions(n):
    from dear.tasks.synthetic import load_synthetic

    return load_synthetic(n=n, seed=0, split="test")


def test_regulated_protocol_drives_engine_with_policy_decisions():
    cfg = DebateConfig(n_agents=3, n_rounds=2, seed=0)
    engine = DebateEngine(SimBackend(seed=0), cfg)
    torch.manual_seed(0)  # the init and the stochastic masks below use the global RNG: independent of test order
    policy = JointPolicy(PolicyConfig(n_agents=3))
    with torch.no_grad():  # make the deterministic masks non-trivial
        torch.nn.init.normal_(policy.selection.net[-1].weight, std=2.0)
    protocol = RegulatedProtocol(policy, make_encoder("hashing"), cfg, deterministic=True)
    debates = engine.run(_synthetic_questions(6), protocol)
    assert all(d.finished for d in debates)
    masks_seen = set()
    for d in debates:
        recs = protocol.records[d.debate_id]
        assert [r.round for r in recs] == [1, 2]
        for rec in recs:
            turns = d.trace.rounds[rec.round]
            assert [t.peers for t in turns] == [list(np.flatnonzero(row)) for row in rec.mask]
            assert np.allclose([t.temperature for t in turns], rec.temperature)
            assert np.allclose([t.top_p for t in turns], rec.top_p)
            # deterministic mode: pairs with p > 0.5, computed from the recorded beliefs
            b, u = torch.tensor([rec.b]), torch.tensor([rec.u])
            expected = pairs_to_mask((policy.selection(selection_observation(b, u)) > 0).float(), 3)[0]
            assert rec.mask == expected.tolist()
    # stochastic mode samples different masks, and the engine still uses exactly the recorded ones
    protocol = RegulatedProtocol(policy, make_encoder("hashing"), cfg, deterministic=False)
    for d in DebateEngine(SimBackend(seed=0), cfg).run(_synthetic_questions(6), protocol):
        for rec in protocol.records[d.debate_id]:
            assert [t.peers for t in d.trace.rounds[rec.round]] == [list(np.flatnonzero(r)) for r in rec.mask]
            masks_seen.add(str(rec.mask))
    assert len(masks_seen) > 1


def test_regulated_protocol_under_run_concurrent_decides_as_in_one_batch():
    """`run_concurrent` runs each debate on its own thread at its own pace; a deterministic DEAR policy then
    makes the same decisions, so the traces equal those of `run` over the whole batch."""
    cfg = DebateConfig(n_agents=3, n_rounds=2, seed=0, layout="multiturn")
    torch.manual_seed(0)
    policy = JointPolicy(PolicyConfig(n_agents=3))
    with torch.no_grad():
        torch.nn.init.normal_(policy.selection.net[-1].weight, std=2.0)
    questions = _synthetic_questions(6)
    batch = RegulatedProtocol(policy, make_encoder("hashing"), cfg, deterministic=True)
    want = DebateEngine(SimBackend(seed=0), cfg).run(questions, batch)
    concurrent = RegulatedProtocol(policy, make_encoder("hashing"), cfg, deterministic=True)
    got = DebateEngine(SimBackend(seed=0), cfg).run_concurrent(questions, concurrent, max_in_flight=3)
    assert [d.question.id for d in got] == [q.id for q in questions]
    for a, b in zip(want, got):
        assert a.trace.answer_keys() == b.trace.answer_keys()
        assert [m.tolist() for m in a.trace.masks()] == [m.tolist() for m in b.trace.masks()]
        assert [r.mask for r in batch.records[a.debate_id]] == [r.mask for r in concurrent.records[b.debate_id]]
        assert np.allclose([t.temperature for r in a.trace.rounds for t in r],
                           [t.temperature for r in b.trace.rounds for t in r], atol=1e-5)
    reads = [sum(map(sum, r.mask)) for recs in concurrent.records.values() for r in recs]
    assert 0 < min(reads) and max(reads) < 6  # sparse masks: neither nobody nor full mesh


def test_regulated_protocol_mad_baseline_is_full_mesh():
    cfg = DebateConfig(n_agents=3, n_rounds=1)
    mad = JointPolicy(PolicyConfig(n_agents=3, selection_mode="full", behavior_mode="fixed"))
    protocol = RegulatedProtocol(mad, make_encoder("hashing"), cfg)
    debates = DebateEngine(SimBackend(seed=1), cfg).run(_synthetic_questions(3), protocol)
    for d in debates:
        assert np.array_equal(d.trace.masks()[1], ~np.eye(3, dtype=bool))
        assert all(abs(t.temperature - 0.7) < 1e-6 and abs(t.top_p - 0.9) < 1e-6 for t in d.trace.rounds[1])
    with pytest.raises(ValueError, match="n_agents"):
        RegulatedProtocol(mad, make_encoder("hashing"), DebateConfig(n_agents=4))


@pytest.mark.slow
def test_regulated_debate_on_smoke_model_with_minilm():
    """The real parts: SmolLM2-135M through llama.cpp and the MiniLM encoder."""
    from dear import tasks
    from dear.llm.registry import make_backend

    cfg = DebateConfig(n_agents=2, n_rounds=1, max_tokens=48)
    policy = JointPolicy(PolicyConfig(n_agents=2))
    protocol = RegulatedProtocol(policy, make_encoder("minilm"), cfg, deterministic=False)
    with make_backend("smoke") as backend:
        debates = DebateEngine(backend, cfg).run(tasks.load("gsm8k", split="test", n=2, seed=0), protocol)
    for d in debates:
        assert len(d.trace.rounds) == 2 and d.trace.completion_tokens > 0
        rec = protocol.records[d.debate_id][0]
        assert np.all(np.asarray(rec.u) > 0) and np.all(np.asarray(rec.u) <= 1)
        assert [t.peers for t in d.trace.rounds[1]] == [list(np.flatnonzero(r)) for r in rec.mask]
