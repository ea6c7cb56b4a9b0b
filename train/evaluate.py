"""Rollout metrics of a set of debates, and a policy evaluated on fixed seeded debates.

`summarize_episodes` gives the `rollout/...` metrics the trainer logs each iteration; `evaluate` runs a policy
in-process on debates fixed by a seed (the learning check and the bench), `mad_policy` puts the MAD baseline in
the policy slot.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Sequence

import numpy as np

from dear.policy import JointPolicy
from dear.seeds import derive_seed
from train.build import make_policy
from train.config import TrainConfig
from train.workers import ChunkSpec, EpisodeStats, LocalPool, run_chunk


def summarize_episodes(all_episodes: Sequence[EpisodeStats]) -> dict[str, float]:
    """Rollout metrics of a set of debates (pooled HCR/BCR: sum of numerators / sum of denominators).

    Computed over the finished debates; failed ones are only counted (`rollout/failed_debates`)."""
    if not all_episodes:
        return {}
    episodes = [e for e in all_episodes if not e.failed]
    n_failed = len(all_episodes) - len(episodes)

    def mean(xs):
        xs = [x for x in xs if not (isinstance(x, float) and math.isnan(x))]
        return float(np.mean(xs)) if xs else math.nan

    hcr_den, bcr_den = sum(e.hcr_den for e in episodes), sum(e.bcr_den for e in episodes)
    return {
        "rollout/reward": mean([e.episode_return for e in episodes]),
        "rollout/reward_correct": mean([e.reward_correct for e in episodes]),
        "rollout/reward_tokens": mean([e.reward_tokens for e in episodes]),
        "rollout/accuracy": mean([e.final_score for e in episodes]),
        "rollout/round0_accuracy": mean([e.round0_accuracy for e in episodes]),
        "rollout/round0_tokens_per_question": mean([e.round0_tokens for e in episodes]),
        "rollout/tokens_per_question": mean([e.tokens for e in episodes]),
        "rollout/prompt_tokens_per_question": mean([e.prompt_tokens for e in episodes]),
        "rollout/completion_tokens_per_question": mean([e.completion_tokens for e in episodes]),
        "rollout/hcr": sum(e.hcr_num for e in episodes) / hcr_den if hcr_den else math.nan,
        "rollout/hcr_cases": float(hcr_den),
        "rollout/bcr": sum(e.bcr_num for e in episodes) / bcr_den if bcr_den else math.nan,
        "rollout/bcr_cases": float(bcr_den),
        "rollout/tie_rate": mean([float(e.tie) for e in episodes]),
        "rollout/failed_debates": float(n_failed),
        "rollout/mean_temperature": mean([e.mean_temperature for e in episodes]),
        "rollout/mean_top_p": mean([e.mean_top_p for e in episodes]),
        "rollout/mask_density": mean([e.mask_density for e in episodes]),
        "rollout/fresh_share": mean([e.fresh_share for e in episodes]),
        "rollout/keep_share": mean([e.keep_share for e in episodes]),
        "rollout/stop_rate": mean([float(e.stopped) for e in episodes]),
        "rollout/episodes": float(len(episodes)),
    }


def evaluate(cfg: TrainConfig, policy: JointPolicy, episodes: int, seed: int, deterministic: bool = True,
             split: str | None = None, per_episode: list[EpisodeStats] | None = None) -> dict[str, float]:
    """Run `episodes` debates in-process under `policy`; same (cfg, episodes, seed, split) = same debates.
    `per_episode`, if given, receives each debate's EpisodeStats in order (for paired comparisons)."""
    if next(policy.parameters()).device.type != "cpu":
        policy = copy.deepcopy(policy).cpu()  # rollouts run on CPU; the learner's policy may be on run.device
    ecfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, split=split or cfg.env.split),
                               rollout=dataclasses.replace(cfg.rollout, num_workers=0))
    pool = LocalPool(ecfg)
    try:
        n = ecfg.rollout.envs_per_worker
        eps: list[EpisodeStats] = []
        for c in range(math.ceil(episodes / n)):
            rng = np.random.default_rng(derive_seed(seed, 7_777_777, c, bits=62))
            spec = ChunkSpec(iteration=-1, index=c, env_seeds=tuple(int(s) for s in rng.integers(0, 2**31 - 1, n)),
                             torch_seed=int(rng.integers(0, 2**62)))
            eps += run_chunk(pool.worker.venv, policy, spec, ecfg.env.n_rounds, deterministic).episodes
        if per_episode is not None:
            per_episode.extend(eps[:episodes])
        return summarize_episodes(eps[:episodes])
    finally:
        pool.close()


def mad_policy(cfg: TrainConfig) -> JointPolicy:
    """The MAD baseline in the policy slot: full mask, fixed sampling (policy.fixed_temperature/top_p)."""
    mcfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, selection_mode="full",
                                                               behavior_mode="fixed"))
    return make_policy(mcfg)
