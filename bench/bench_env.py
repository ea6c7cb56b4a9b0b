"""Environment throughput: sim steps/s (single env and vector env) and one real-model episode's wall time.

    python bench/bench_env.py                           # sim: single env + vector env (64 sub-debates)
    python bench/bench_env.py --llm local --max-tokens 256   # plus one real episode on the embedded model
    python bench/bench_env.py --llm smoke --skip-sim

A "step" is one exchange round of one debate (V LLM calls); resets (round 0) are included in the wall time.
Numbers from the sim backend are labelled [synthetic].
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dear.atomic import write_json
from dear.cli import run as run_cli
from dear.debate.cli_args import OMIT, add_backend_args, add_debate_args, add_question_args
from dear.policy import JointPolicy, PolicyConfig
from envs.debate_env import DebateEnv
from envs.vector_env import DebateVectorEnv


def bench_single(seconds: float, n_agents: int, n_rounds: int) -> dict:
    env = DebateEnv(llm="sim", task="synthetic", n_questions=2000, n_agents=n_agents, n_rounds=n_rounds)
    env.action_space.seed(0)
    env.reset(seed=0)
    steps, episodes, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, terminated, _, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated:
            episodes += 1
            env.reset()
    dt = time.perf_counter() - t0
    env.close()
    return {"steps_per_s": steps / dt, "episodes_per_s": episodes / dt, "steps": steps, "seconds": dt}


def bench_vector(seconds: float, num_envs: int, n_agents: int, n_rounds: int, with_policy: bool) -> dict:
    venv = DebateVectorEnv(
        num_envs=num_envs, llm="sim", task="synthetic", n_questions=2000, n_agents=n_agents, n_rounds=n_rounds
    )
    venv.action_space.seed(0)
    policy = JointPolicy(PolicyConfig(n_agents=n_agents))
    obs, _ = venv.reset(seed=0)
    vsteps, episodes, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if with_policy:
            out = policy.act(
                torch.as_tensor(obs["selection"]),
                torch.as_tensor(obs["belief"]),
                torch.as_tensor(obs["uncertainty"]),
            )
            action = out.env_action()
        else:
            action = venv.action_space.sample()
        obs, _, term, _, _ = venv.step(action)
        vsteps += 1
        episodes += int(term.sum())
    dt = time.perf_counter() - t0
    stats = venv.engine.stats
    venv.close()
    return {
        "sub_env_steps_per_s": vsteps * num_envs / dt,
        "vector_steps_per_s": vsteps / dt,
        "episodes_per_s": episodes / dt,
        "debates_per_min": 60 * episodes / dt,
        "seconds": dt,
        "backend_share": stats.backend_s / dt,
    }


def bench_real(llm: str, n_agents: int, n_rounds: int, max_tokens: int, task: str, split: str) -> dict:
    t0 = time.perf_counter()
    env = DebateEnv(
        llm=llm,
        task=task,
        split=split,
        n_questions=20,
        n_agents=n_agents,
        n_rounds=n_rounds,
        max_tokens=max_tokens,
    )
    t_load = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    t1 = time.perf_counter()
    env.reset(seed=0)
    terminated, info = False, {}
    while not terminated:
        action = {
            "mask": np.ones(n_agents * (n_agents - 1), np.int8),
            "behavior": rng.normal(0, 1, 2 * n_agents).astype(np.float32),
        }
        _, reward, terminated, _, info = env.step(action)
    t_episode = time.perf_counter() - t1
    backend_s = env.engine.stats.backend_s  # includes round 0
    env.close()
    return {
        "llm": llm,
        "model": info["episode"].trace.model_ids[0],
        "load_s": t_load,
        "episode_wall_s": t_episode,
        "backend_s": backend_s,
        "tokens": info["tokens_total"],
        "final_correct": info["final_correct"],
        "reward": reward,
        "n_agents": n_agents,
        "n_rounds": n_rounds,
        "max_tokens": max_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python bench/bench_env.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="wall time per sim measurement")
    ap.add_argument("--num-envs", type=int, default=64)
    add_debate_args(ap, seed=OMIT)
    add_backend_args(ap, llm=None, llm_note="also time one real episode on this backend", max_tokens=256,
                     parallel=OMIT, n_ctx=OMIT)
    add_question_args(ap, split="test")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(1)

    results = {}
    if not args.skip_sim:
        s = bench_single(args.seconds, args.n_agents, args.n_rounds)
        print(
            f"[synthetic] single env: {s['steps_per_s']:.0f} steps/s ({s['episodes_per_s']:.0f} episodes/s)"
        )
        v = bench_vector(args.seconds, args.num_envs, args.n_agents, args.n_rounds, with_policy=False)
        print(
            f"[synthetic] vector env x{args.num_envs}: {v['sub_env_steps_per_s']:.0f} sub-env steps/s "
            f"({v['vector_steps_per_s']:.1f} batched steps/s, {v['debates_per_min']:.0f} debates/min, "
            f"{100 * v['backend_share']:.0f}% in the backend)"
        )
        p = bench_vector(args.seconds, args.num_envs, args.n_agents, args.n_rounds, with_policy=True)
        print(
            f"[synthetic] vector env x{args.num_envs} + JointPolicy.act: {p['sub_env_steps_per_s']:.0f} "
            f"sub-env steps/s ({p['debates_per_min']:.0f} debates/min)"
        )
        results.update(synthetic_single=s, synthetic_vector=v, synthetic_vector_policy=p)
    if args.llm:
        r = bench_real(args.llm, args.n_agents, args.n_rounds, args.max_tokens, args.task, args.split)
        print(
            f"real episode ({r['model']}, V={r['n_agents']}, R={r['n_rounds']}, "
            f"max_tokens={r['max_tokens']}): "
            f"{r['episode_wall_s']:.1f} s wall ({r['backend_s']:.1f} s in the backend, "
            f"+{r['load_s']:.1f} s load), "
            f"{r['tokens']} tokens, "
            f"correct={r['final_correct']}"
        )
        results["real"] = r
    if args.json:
        write_json(args.json, results, indent=2, default=str)


if __name__ == "__main__":
    run_cli(main, "python bench/bench_env.py")
