"""Read rate by (reader profile, read profile) of a trained policy on shuffled test debates (synthetic)."""
import sys, glob, collections, torch, numpy as np
from safetensors.torch import load_file
from train.config import load_config
from train.build import make_policy, make_vector_env, make_local_backend
run = sys.argv[1]
cfg = load_config(f"{run}/config.yaml")
pol = make_policy(cfg)
t = load_file(sorted(glob.glob(f"{run}/checkpoints/iter_*"))[-1] + "/model.safetensors")
pol.behavior.load_state_dict({k[9:]: v for k, v in t.items() if k.startswith("behavior.")})
pol.selection.load_state_dict({k[10:]: v for k, v in t.items() if k.startswith("selection.")})
from envs.debate_env import DebateEnv
import dataclasses
e = cfg.env
env = DebateEnv(llm="sim", llm_kwargs=cfg.llm.options, task=e.task, split="test", n_agents=3, n_rounds=e.n_rounds,
                token_cost=e.token_cost, silent=e.silent, behavior_map=cfg.policy.behavior_map,
                agent_profiles=e.profiles("sim"), shuffle_profiles=e.shuffle_profiles, profile_feature=e.profile_feature)
names = [p.name for p in env.config.agent_profiles]
reads, seen = collections.Counter(), collections.Counter()
for s in range(128):
    obs, _ = env.reset(seed=1000 + s)
    done = False
    while not done:
        a = pol.act(torch.tensor(obs["selection"])[None], torch.tensor(obs["belief"])[None], torch.tensor(obs["uncertainty"])[None], deterministic=True)
        prof = [names[env.debate.pool_index(i)] for i in range(3)]
        m = a.mask[0].numpy()
        for i in range(3):
            for j in range(3):
                if i != j:
                    key = (prof[i] + ("#" + str(env.debate.pool_index(i)) if prof[i] == "direct" else ""), prof[j] + ("#" + str(env.debate.pool_index(j)) if prof[j] == "direct" else ""))
                    key = (prof[i], prof[j])
                    seen[key] += 1; reads[key] += int(m[i, j])
        obs, r, term, trunc, info = env.step({k: v[0] for k, v in a.env_action().items()})
        done = term or trunc
for k in sorted(seen):
    print(f"{k[0]:>8} reads {k[1]:<8} {reads[k] / seen[k]:.2f}  (n={seen[k]})")
