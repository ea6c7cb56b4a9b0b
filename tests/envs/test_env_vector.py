"""DebateVectorEnv: one backend call per round, SAME_STEP autoreset, batched spaces, policy round trip."""

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import envs  # noqa: F401
from dear.llm.wrapper import BackendWrapper
from dear.policy import JointPolicy, PolicyConfig
from dear.sim import SimBackend
from envs.vector_env import DebateVectorEnv


class CountingBackend(BackendWrapper):
    """Test double that forwards to the real sim backend and records each generate call's batch size."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls: list[int] = []

    def generate(self, requests):
        self.calls.append(len(requests))
        return self.inner.generate(requests)


def make(num_envs=4, **kw):
    kw.setdefault("task", "synthetic")
    kw.setdefault("n_questions", 100)
    kw.setdefault("llm", "sim")
    return DebateVectorEnv(num_envs=num_envs, **kw)


def test_one_backend_call_per_round():
    backend = CountingBackend(SimBackend(seed=0))
    n, v = 6, 3
    venv = make(num_envs=n, llm=backend, n_agents=v, n_rounds=2)
    venv.reset(seed=0)
    assert backend.calls == [n * v]  # round 0 of all sub-debates
    _, _, term, _, _ = venv.step(venv.action_space.sample())
    assert backend.calls == [n * v] * 2 and not term.any()
    _, _, term, _, _ = venv.step(venv.action_space.sample())
    # the last exchange round, then round 0 of the next debates (autoreset): one call per round
    assert term.all() and backend.calls == [n * v] * 4
    assert venv.engine.stats.generate_calls == 4


def test_metadata_spaces_and_shapes():
    venv = make(num_envs=5, n_agents=3)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, infos = venv.reset(seed=1)
    assert venv.observation_space.contains(obs)
    assert obs["selection"].shape == (5, 21) and obs["belief"].shape == (5, 3, 3)
    assert venv.action_space["mask"].shape == (5, 6) and venv.action_space["behavior"].shape == (5, 6)
    assert infos["correct"].shape == (5, 3) and infos["synthetic"].all()


def test_same_step_autoreset_and_episode_stats():
    n, v, rounds = 4, 3, 2
    venv = make(num_envs=n, n_agents=v, n_rounds=rounds, token_cost=0.1)
    obs, infos = venv.reset(seed=2)
    first_ids = list(infos["debate_id"])
    for _round in range(rounds):
        obs, rew, term, trunc, infos = venv.step(venv.action_space.sample())
    assert term.all() and not trunc.any()
    assert infos["_final_obs"].all() and infos["final_info"]["_final_correct"].all()
    fi = infos["final_info"]
    for k in range(n):
        trace = fi["episode"][k].trace
        assert trace.debate_id == first_ids[k] and len(trace.rounds) == rounds + 1
        assert rew[k] == pytest.approx(fi["reward_correct"][k] + fi["reward_tokens"][k])
        assert fi["reward_tokens"][k] == pytest.approx(-0.1 * trace.total_tokens / 1000)
        assert fi["correct_per_round"][k].shape == (rounds + 1, v)
        assert np.array_equal(fi["correct_per_round"][k], trace.correctness())
        assert fi["episode_return"][k] == pytest.approx(rew[k])
        # terminal observation: state's round feature = 1; the returned obs is the new debate's round 0
        assert infos["final_obs"][k]["state"][v * v + v] == pytest.approx(1.0)
        assert obs["state"][k][v * v + v] == 0.0
    assert all(infos["debate_id"][k] != first_ids[k] for k in range(n))
    assert infos["round"].tolist() == [0] * n


def test_seeded_reset_reproducible():
    a, b = make(num_envs=3), make(num_envs=3)
    oa, ia = a.reset(seed=7)
    ob, ib = b.reset(seed=7)
    assert all(np.array_equal(oa[k], ob[k]) for k in oa)
    assert list(ia["debate_id"]) == list(ib["debate_id"])


def test_policy_drives_vector_env():
    """JointPolicy.act on the env observation -> env_action() is a valid batched action."""
    n, v = 8, 3
    venv = make(num_envs=n, n_agents=v, n_rounds=2)
    policy = JointPolicy(PolicyConfig(n_agents=v))
    obs, _ = venv.reset(seed=3)
    for _ in range(2):
        out = policy.act(
            torch.as_tensor(obs["selection"]),
            torch.as_tensor(obs["belief"]),
            torch.as_tensor(obs["uncertainty"]),
        )
        action = out.env_action()
        assert venv.action_space.contains(action)
        obs, _rew, term, _, infos = venv.step(action)
        assert np.array_equal(infos["final_info"]["mask"] if term.all() else infos["mask"], out.mask.numpy())
    assert venv.last_belief.b.shape == (n, v, v)


def test_make_vec_entry_point():
    venv = gymnasium.make_vec(
        "dear/Debate-v0",
        num_envs=3,
        vectorization_mode="vector_entry_point",
        llm="sim",
        task="synthetic",
        n_questions=10,
    )
    obs, _ = venv.reset(seed=0)
    assert obs["state"].shape[0] == 3
    venv.close()


def test_bad_batched_actions():
    venv = make(num_envs=3)
    venv.reset(seed=0)
    good = venv.action_space.sample()
    bad = dict(good, behavior=good["behavior"].copy())
    bad["behavior"][1, 2] = np.nan
    with pytest.raises(ValueError, match=r"actions\[1\]\['behavior'\].*NaN"):
        venv.step(bad)
    with pytest.raises(ValueError, match=r"actions\['mask'\].*num_envs=3"):
        venv.step(dict(good, mask=good["mask"][:2]))
    with pytest.raises(ValueError, match=r"actions\[0\]\['mask'\].*shape"):
        venv.step(dict(good, mask=np.ones((3, 5), np.int8)))
    with pytest.raises(ValueError, match="keys"):
        venv.step({"mask": good["mask"]})


def test_autoreset_disabled_mode():
    backend = CountingBackend(SimBackend(seed=0))
    n, v = 3, 3
    venv = make(num_envs=n, llm=backend, n_agents=v, n_rounds=2, autoreset_mode=AutoresetMode.DISABLED)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    venv.reset(seed=0)
    venv.step(venv.action_space.sample())
    obs, _rew, term, _, infos = venv.step(venv.action_space.sample())
    assert term.all() and backend.calls == [n * v] * 3  # no round 0 generated for debates never stepped
    assert "final_info" not in infos and infos["_final_correct"].all()
    assert infos["episode"][0].trace.debate_id == infos["debate_id"][0]
    assert obs["state"][0][v * v + v] == pytest.approx(1.0)  # the terminal observation itself
    with pytest.raises(RuntimeError, match="reset_mask"):
        venv.step(venv.action_space.sample())
    obs, infos = venv.reset(options={"reset_mask": np.array([True, False, True])})
    assert backend.calls[-1] == 2 * v and list(infos["_round"]) == [True, False, True]
    with pytest.raises(RuntimeError, match=r"\[1\]"):
        venv.step(venv.action_space.sample())
    with pytest.raises(ValueError, match="reset_mask"):
        venv.reset(options={"reset_mask": [1, 0, 1]})
    with pytest.raises(ValueError, match="autoreset_mode"):
        make(num_envs=2, autoreset_mode=AutoresetMode.NEXT_STEP)
