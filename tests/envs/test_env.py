"""DebateEnv (dear/Debate-v0): check_env, spaces, action -> prompts, sampling mapping, reward, bad input."""

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers dear/Debate-v0)
from dear.llm.base import Completion
from dear.metrics import round_vote
from dear.policy import RAW_BOUND, pair_order, to_sampling
from dear.regulator import state_dim
from dear.sim import SimBackend
from envs.debate_env import DebateEnv, EpisodeSummary


def make(**kw) -> DebateEnv:
    kw.setdefault("llm", "sim")
    kw.setdefault("task", "synthetic")
    kw.setdefault("n_questions", 50)
    return DebateEnv(**kw)


def random_action(env, rng):
    v = env.config.n_agents
    return {
        "mask": rng.integers(0, 2, v * (v - 1)).astype(np.int8),
        "behavior": rng.uniform(-3, 3, 2 * v).astype(np.float32),
    }


# The raw behavior Box is [-10, 10] by design (pre-sigmoid values), not the [-1, 1] gymnasium suggests.
@pytest.mark.filterwarnings("ignore:.*symmetric and normalized space")
@pytest.mark.parametrize("v", [2, 3, 5])
def test_check_env_passes(v):
    env = make(n_agents=v)
    check_env(env, skip_render_check=True)
    env.close()


def test_gymnasium_make_sim():
    env = gymnasium.make(
        "dear/Debate-v0", llm="sim", task="synthetic", n_questions=20, n_agents=3, n_rounds=2
    )
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert info["synthetic"] is True
    steps = 0
    terminated = False
    while not terminated:
        obs, _reward, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
        assert not truncated
    assert steps == 2
    ep = info["episode"]
    assert isinstance(ep, EpisodeSummary) and ep.trace.final_answer == ep.final_answer == info["final_answer"]
    assert ep.final_correct == info["final_correct"] and ep.tokens_total == info["tokens_total"] and not ep.failed
    assert ep.temperature_per_round.shape == ep.top_p_per_round.shape == (3, 3)  # (R+1, V)
    assert ep.temperature_per_round[1:].tolist() == [[t.temperature for t in r] for r in ep.trace.rounds[1:]]
    assert ep.masks_per_round.shape == (3, 3, 3) and ep.answers_per_round == ep.trace.answer_keys()
    env.close()


@pytest.mark.parametrize("v", [2, 3, 5])
def test_spaces_and_shapes(v):
    env = make(n_agents=v, n_rounds=3)
    assert env.observation_space["selection"].shape == (v * (2 * v + 1),)
    assert env.observation_space["belief"].shape == (v, v)
    assert env.observation_space["uncertainty"].shape == (v,)
    assert env.observation_space["state"].shape == (state_dim(v),)
    assert env.action_space["mask"].n == v * (v - 1)
    assert env.action_space["behavior"].shape == (2 * v,)
    obs, info = env.reset(seed=v)
    rng = np.random.default_rng(v)
    for r in range(1, 4):
        assert env.observation_space.contains(obs)
        assert all(a.dtype == np.float32 for a in obs.values())
        assert np.allclose(obs["belief"].sum(-1) + obs["uncertainty"], 1.0, atol=1e-5)
        obs, _reward, terminated, _truncated, info = env.step(random_action(env, rng))
        assert info["round"] == r and len(info["answers"]) == v and info["correct"].shape == (v,)
        assert terminated == (r == 3)
    assert info["correct_per_round"].shape == (4, v)
    env.close()


def test_action_mask_is_the_mask_the_next_prompts_used():
    env = make(n_agents=4, n_rounds=3, layout="single")  # one prompt per round: peers read now, nothing older
    rng = np.random.default_rng(0)
    env.reset(seed=1)
    order = pair_order(4)
    for _ in range(3):
        prev = env.debate.last_turns
        action = random_action(env, rng)
        env.step(action)
        turns = env.debate.trace.rounds[-1]
        for i, turn in enumerate(turns):
            expected = [j for k, (a, j) in enumerate(order) if a == i and action["mask"][k] == 1]
            assert turn.peers == expected  # read back from the trace
            prompt = "\n".join(m["content"] for m in turn.messages)
            for j in range(4):
                if j != i:  # the peer's block ("Agent j+1:") is in agent i's prompt iff i reads j
                    assert (f"Agent {j + 1}:" in prompt) == (j in expected), (i, j)
            if expected:
                assert prev[expected[-1]].reasoning in prompt
        assert np.array_equal(
            env.debate.trace.masks()[-1], np.array([[k in t.peers for k in range(4)] for t in turns])
        )
    env.close()


def test_sampling_mapping_hits_configured_bounds():
    t_range, p_range = (0.2, 1.1), (0.6, 0.95)
    env = make(n_agents=3, n_rounds=2, temperature_range=t_range, top_p_range=p_range)
    env.reset(seed=0)
    low = {"mask": np.ones(6, np.int8), "behavior": np.full(6, -RAW_BOUND, np.float32)}
    high = {"mask": np.ones(6, np.int8), "behavior": np.full(6, RAW_BOUND, np.float32)}
    env.step(low)
    assert all(abs(t.temperature - 0.2) < 1e-3 and abs(t.top_p - 0.6) < 1e-3 for t in env.debate.last_turns)
    _, _, _, _, _info = env.step(high)
    assert all(abs(t.temperature - 1.1) < 1e-3 and abs(t.top_p - 0.95) < 1e-3 for t in env.debate.last_turns)
    # mixed per-agent values use the one mapping in dear.policy
    env.reset(seed=1)
    raw = np.array([-1.0, 2.0, 0.0, 0.5, 3.0, -2.5], np.float32)
    env.step({"mask": np.ones(6, np.int8), "behavior": raw})
    s = to_sampling(raw.reshape(3, 2), t_range, p_range)
    assert np.allclose([t.temperature for t in env.debate.last_turns], s.temperature, atol=1e-6)
    assert np.allclose([t.top_p for t in env.debate.last_turns], s.top_p, atol=1e-6)
    env.close()


def test_reward_parts_and_token_cost():
    env = make(n_rounds=2, token_cost=0.5)
    rng = np.random.default_rng(3)
    for ep in range(5):
        env.reset(seed=ep)
        _, r1, term, _, info = env.step(random_action(env, rng))
        assert r1 == 0.0 and not term and "reward_correct" not in info
        _, r2, term, _, info = env.step(random_action(env, rng))
        assert term
        trace = info["episode"].trace
        assert info["reward_correct"] == float(trace.final_correct)
        assert info["reward_tokens"] == pytest.approx(-0.5 * trace.total_tokens / 1000)
        assert trace.total_tokens > 0
        assert r2 == pytest.approx(info["reward_correct"] + info["reward_tokens"])
        assert info["tokens_total"] == trace.total_tokens
    env.close()


def _shaping_terms(env, reset_seed: int, action_seed: int) -> tuple[list[float], float, dict]:
    """Shaping part of each step's reward for one episode under random actions, Φ(s_0), last info."""
    rng = np.random.default_rng(action_seed)
    _, info0 = env.reset(seed=reset_seed)
    terms, terminated = [], False
    while not terminated:
        _, r, terminated, _, info = env.step(random_action(env, rng))
        terms.append(info["reward_shaping"])
        assert r == pytest.approx(info["reward_shaping"] + info.get("reward_correct", 0.0))  # token_cost = 0
    return terms, round_vote(info0["answers"], info0["correct"]).score, info


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_shaping_telescopes_to_a_policy_independent_constant(gamma):
    """F_r = coef (γ Φ(s_r) - Φ(s_{r-1})), Φ = the round's plurality score, Φ(terminal) = 0: the discounted sum
    is -coef Φ(s_0) whatever the actions, while the intermediate terms do depend on them (so the shaping still
    carries signal)."""
    coef = 0.5
    env = make(n_rounds=3, shaping=True, shaping_coef=coef, shaping_gamma=gamma, token_cost=0.0)
    # a round 0 whose plurality is wrong and can be corrected, so the actions change the terms
    runs = [_shaping_terms(env, reset_seed=9, action_seed=a) for a in range(6)]
    phi0 = runs[0][1]
    for terms, phi, info in runs:
        assert phi == phi0  # same seeded round 0
        discounted = sum(gamma**t * f for t, f in enumerate(terms))
        assert discounted == pytest.approx(-coef * phi0, abs=1e-12)
        # the last term pays back the potential of round R-1 (Φ(terminal) = 0), not the final correctness
        # Φ = the round's plurality score (ties as expected values); rows: rounds 0..R
        phi_before_last = round_vote(info["answers_per_round"][-2], info["correct_per_round"][-2]).score
        assert terms[-1] == pytest.approx(-coef * phi_before_last)
    assert len({tuple(round(f, 12) for f in terms) for terms, _, _ in runs}) > 1  # actions changed the terms
    env.close()


def test_shaping_gamma_must_be_a_discount():
    with pytest.raises(ValueError, match="shaping_gamma"):
        make(shaping=True, shaping_gamma=1.5)


def test_seeded_reset_is_deterministic_and_question_index():
    env = make()
    o1, i1 = env.reset(seed=11)
    o2, i2 = env.reset(seed=11)
    assert all(np.array_equal(o1[k], o2[k]) for k in o1) and i1["question_id"] == i2["question_id"]
    _, info = env.reset(options={"question_index": 7})
    assert info["question_id"] == env.core.questions[7].id
    with pytest.raises(ValueError, match="question_index"):
        env.reset(options={"question_index": 10_000})
    with pytest.raises(ValueError, match="unknown keys"):
        env.reset(options={"question": 1})


@pytest.mark.parametrize(
    "action, field",
    [
        ({"mask": np.ones(5, np.int8), "behavior": np.zeros(6, np.float32)}, r"\['mask'\].*shape"),
        ({"mask": np.ones((3, 3), np.int8), "behavior": np.zeros(6, np.float32)}, r"\['mask'\].*shape"),
        ({"mask": np.full(6, 2), "behavior": np.zeros(6, np.float32)}, r"\['mask'\].*0/1"),
        (
            {"mask": np.ones(6, np.int8), "behavior": np.array([0, 0, np.nan, 0, 0, 0], np.float32)},
            r"\['behavior'\].*NaN",
        ),
        ({"mask": np.ones(6, np.int8), "behavior": np.full(6, 11.0, np.float32)}, r"\['behavior'\].*\[-10"),
        ({"mask": np.ones(6, np.int8), "behavior": np.zeros(4, np.float32)}, r"\['behavior'\].*shape"),
        ({"mask": np.ones(6, np.int8)}, "keys"),
        ({"mask": np.ones(6, np.int8), "behavior": np.zeros(6), "extra": 1}, "keys"),
        (np.zeros(12), "dict"),
    ],
)
def test_bad_actions_raise_naming_the_field(action, field):
    env = make()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=field):
        env.step(action)
    # the env is still usable after a rejected action
    env.step({"mask": np.ones(6, np.int8), "behavior": np.zeros(6, np.float32)})


def test_step_before_reset_and_after_end():
    env = make(n_rounds=1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.action_space.sample())
    env.reset(seed=0)
    env.step(env.action_space.sample())
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.action_space.sample())


def test_bad_constructor_args():
    with pytest.raises(ValueError, match="n_rounds"):
        make(n_rounds=0)
    with pytest.raises(ValueError, match="temperature_range"):
        make(temperature_range=(1.0, 0.5))
    with pytest.raises(ValueError, match="llm"):
        DebateEnv(llm=3, task="synthetic", n_questions=5)


@pytest.mark.slow
def test_one_episode_on_the_real_smoke_model():
    """A real llama.cpp model (SmolLM2-135M) and the real MiniLM encoder, one full episode."""
    env = gymnasium.make(
        "dear/Debate-v0",
        llm="smoke",
        task="gsm8k",
        split="test",
        n_questions=5,
        n_agents=2,
        n_rounds=1,
        max_tokens=48,
    )
    obs, info = env.reset(seed=0)
    assert info["synthetic"] is False and env.observation_space.contains(obs)
    action = {"mask": np.array([1, 0], np.int8), "behavior": np.zeros(4, np.float32)}
    obs, reward, terminated, _truncated, info = env.step(action)
    assert terminated and env.observation_space.contains(obs)
    trace = info["episode"].trace
    assert trace.model_ids[0].startswith("smoke")
    assert trace.rounds[1][0].peers == [1] and trace.rounds[1][1].peers == []
    assert trace.completion_tokens > 0 and trace.prompt_tokens > 0
    assert reward == pytest.approx(info["reward_correct"] + info["reward_tokens"])
    assert abs(trace.rounds[1][0].temperature - 0.65) < 1e-6  # sigmoid(0) -> middle of (0.1, 1.2)
    env.close()


class FailingBackend(SimBackend):
    """Test double: the real sim backend, except that requests of round `fail_round` come back failed."""

    def __init__(self, fail_round: int):
        super().__init__(seed=0)
        self.fail_round = fail_round

    def generate(self, requests):
        out = super().generate(requests)
        for k, req in enumerate(requests):
            if req.metadata["round"] == self.fail_round:
                out[k] = Completion("", 0, 0, "error", 0.0, error="boom")
        return out


@pytest.mark.parametrize("fail_round", [0, 1])
def test_backend_failure_ends_the_episode_as_wrong(fail_round):
    env = make(llm=FailingBackend(fail_round), n_rounds=2, token_cost=0.0)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and info["failed"] == (fail_round == 0)
    _, reward, terminated, _, info = env.step(
        {"mask": np.ones(6, np.int8), "behavior": np.zeros(6, np.float32)}
    )
    assert terminated and info["failed"] and reward == 0.0 and info["final_correct"] is False
    assert "boom" in info["episode"].trace.error
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"mask": np.ones(6, np.int8), "behavior": np.zeros(6, np.float32)})


def test_action_mask_decides_the_peers_of_the_new_turn_in_the_multiturn_layout():
    """Multiturn: the conversation keeps earlier turns, and the new user turn carries exactly the peers read."""
    env = make(n_agents=4, n_rounds=2, layout="multiturn")
    rng = np.random.default_rng(1)
    env.reset(seed=2)
    order = pair_order(4)
    for _ in range(2):
        prev = env.debate.last_turns
        action = random_action(env, rng)
        env.step(action)
        for i, turn in enumerate(env.debate.trace.rounds[-1]):
            expected = [j for k, (a, j) in enumerate(order) if a == i and action["mask"][k] == 1]
            new_turn = turn.messages[-1]["content"]
            assert turn.messages[-1]["role"] == "user"
            for j in range(4):
                if j != i:
                    assert (prev[j].reasoning in new_turn) == (j in expected), (i, j)
    env.close()
