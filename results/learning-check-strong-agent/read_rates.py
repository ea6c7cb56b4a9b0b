"""Read rate by (reader profile, read profile) of a trained policy's final checkpoint on 128 shuffled test
debates (synthetic), deterministic actions. Usage, from the repository root:
PYTHONPATH=. python results/learning-check-strong-agent/read_rates.py <run dir>"""
import collections
import glob
import sys

import torch
from safetensors.torch import load_file

from envs.debate_env import DebateEnv
from train.build import make_policy
from train.config import load_config

run = sys.argv[1]
cfg = load_config(f"{run}/config.yaml")
policy = make_policy(cfg)
weights = load_file(sorted(glob.glob(f"{run}/checkpoints/iter_*"))[-1] + "/model.safetensors")
for part in ("selection", "behavior"):
    getattr(policy, part).load_state_dict({k[len(part) + 1:]: v for k, v in weights.items() if k.startswith(part + ".")})
e = cfg.env
env = DebateEnv(llm="sim", llm_kwargs=cfg.llm.options, task=e.task, split="test", n_agents=e.n_agents,
                n_rounds=e.n_rounds, token_cost=e.token_cost, silent=e.silent, behavior_map=cfg.policy.behavior_map,
                agent_profiles=e.profiles("sim"), shuffle_profiles=e.shuffle_profiles, profile_feature=e.profile_feature)
names = [p.name for p in env.config.agent_profiles]
reads, seen = collections.Counter(), collections.Counter()
for s in range(128):
    obs, _ = env.reset(seed=1000 + s)
    done = False
    while not done:
        act = policy.act(*(torch.tensor(obs[k])[None] for k in ("selection", "belief", "uncertainty")),
                         deterministic=True)
        seated = [names[env.debate.pool_index(i)] for i in range(e.n_agents)]
        mask = act.mask[0].numpy()
        for i in range(e.n_agents):
            for j in range(e.n_agents):
                if i != j:
                    seen[seated[i], seated[j]] += 1
                    reads[seated[i], seated[j]] += int(mask[i, j])
        obs, _, terminated, truncated, _ = env.step({k: v[0] for k, v in act.env_action().items()})
        done = terminated or truncated
for pair in sorted(seen):
    print(f"{pair[0]:>8} reads {pair[1]:<8} {reads[pair] / seen[pair]:.2f}  (n={seen[pair]})")
