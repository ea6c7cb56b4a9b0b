"""rollout.group_size: debates in groups that share question and seed, and the leave-one-out group baseline."""

import numpy as np
import pytest
import torch

from dear.seeds import derive_seed
from train.algorithm import HAPPO
from dear.policy import Critic
from train.build import make_policy
from train.config import ConfigError, load_config
from train.group_baseline import group_centred
from train.workers import LocalPool, group_ids, make_chunks, run_chunk

SMALL = ["logging.progress=false", "rollout.num_workers=0", "rollout.envs_per_worker=8",
         "rollout.episodes_per_iter=16"]


def test_each_advantage_is_measured_against_its_groups_others():
    adv = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    group = torch.tensor([0.0, 0.0, 0.0, 9.0])
    got = group_centred(adv, group)
    assert torch.allclose(got[0], torch.tensor([1 - 4.0, 2 - 5.0]))  # minus the mean of rows 1 and 2
    assert torch.allclose(got[2], torch.tensor([5 - 2.0, 6 - 3.0]))
    assert torch.equal(got[3], adv[3])  # alone in its group: unchanged
    valid = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])  # row 1 stopped after step 0
    got = group_centred(adv, group, valid)
    assert got[0, 1] == pytest.approx(2 - 6.0) and got[2, 1] == pytest.approx(6 - 2.0)  # row 1 does not count
    assert torch.equal(group_centred(adv, torch.arange(4.0)), adv)


def test_groups_share_env_seeds_within_a_chunk_and_size_one_keeps_the_old_chunks():
    one = make_chunks(load_config("sim-stylised", SMALL + ["rollout.group_size=1"]), 3)
    four = make_chunks(load_config("sim-stylised", SMALL + ["rollout.group_size=4"]), 3)
    for c in one:
        assert len(set(c.env_seeds)) == 8 and group_ids(c).unique().numel() == 8
    rng = np.random.default_rng(derive_seed(1, 3, 0, bits=62))  # run.seed 1, iteration 3, chunk 0
    assert one[0].env_seeds == tuple(int(s) for s in rng.integers(0, 2**31 - 1, size=8))  # as before groups
    for c in four:
        s = c.env_seeds
        assert s[:4] == (s[0],) * 4 and s[4:] == (s[4],) * 4 and s[0] != s[4]
        assert group_ids(c).tolist() == [c.index * 8] * 4 + [c.index * 8 + 4] * 4
    assert set(group_ids(four[0]).tolist()).isdisjoint(group_ids(four[1]).tolist())
    with pytest.raises(ConfigError, match="rollout.group_size"):
        load_config("sim-stylised", SMALL + ["rollout.group_size=3"])


def test_a_group_plays_one_question_with_one_set_of_draws_and_the_update_centres_on_it():
    """Same question and debate seed in a group: a deterministic policy gets the same return in every member
    (the draws are common); a sampling one differs only by its actions. The learner's advantages are centred
    per group; the critic's returns are GAE's."""
    cfg = load_config("sim-stylised", SMALL + ["rollout.group_size=4"])
    policy = make_policy(cfg)
    pool = LocalPool(cfg)
    try:
        chunk = make_chunks(cfg, 0)[0]
        fixed = run_chunk(pool.worker.venv, policy, chunk, cfg.env.n_rounds, deterministic=True)
        sampled = run_chunk(pool.worker.venv, policy, chunk, cfg.env.n_rounds, deterministic=False)
    finally:
        pool.close()
    r = fixed.batch.rewards.sum(1)
    assert torch.equal(r[:4], r[:1].expand(4)) and torch.equal(r[4:], r[4:5].expand(4))
    q = [e.question_id for e in fixed.episodes]
    assert q[:4] == [q[0]] * 4 and q[4:] == [q[4]] * 4 and q[0] != q[4]
    batch = sampled.batch
    assert not torch.equal(batch.raw_behavior[0], batch.raw_behavior[1])  # the actions are the members' own
    algo = HAPPO(policy, Critic(batch.state.shape[-1], cfg.policy.critic_hidden), cfg.happo)
    gae = algo.advantages(batch)
    plain = algo.advantages(type(batch)(**{**batch.__dict__, "group": None}))
    assert torch.allclose(gae.returns, plain.returns)
    assert torch.allclose(gae.advantages, group_centred(plain.advantages, batch.group))
    assert not torch.allclose(gae.advantages, plain.advantages)
