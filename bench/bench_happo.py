"""Trainer benchmarks.

    python bench/bench_happo.py                 # HAPPO update time (4,096 transitions) + sim rollout SPS, 1 vs 2 Ray workers
    python bench/bench_happo.py --embedded      # also: share of an iteration spent outside LLM generation (embedded model)
    python bench/bench_happo.py --update-devices  # only: HAPPO update time on CPU next to CUDA ("no GPU" without one)

Targets: update < 1 s on CPU; share outside generation <= 5 % with the embedded model.
Sim numbers are synthetic (no LLM) and measure the pipeline only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dear.policy import Critic
from dear.regulator import state_dim
from train.algorithm import HAPPO
from train.buffer import RolloutBatch
from train.config import load_config
from train.build import make_policy
from train.workers import make_chunks


def _update_batch(policy, v: int, t: int, e: int) -> RolloutBatch:
    """A synthetic batch of e episodes x t steps with log-probs from `policy` (on CPU, as rollouts deliver it)."""
    g = torch.Generator().manual_seed(0)
    pairs = (torch.rand(e, t, v * (v - 1), generator=g) > 0.5).float()
    beh = torch.rand(e, t, v, 2 * v + 2, generator=g)
    raw = torch.randn(e, t, v, 2, generator=g)
    sel = torch.rand(e, t, v * (2 * v + 1), generator=g)
    with torch.no_grad():
        lps, _ = policy.evaluate_selection(sel.reshape(e * t, -1), pairs.reshape(e * t, -1))
        lpb, _ = policy.evaluate_behavior(beh.reshape(e * t, v, -1), raw.reshape(e * t, v, 2))
    dones = torch.zeros(e, t)
    dones[:, -1] = 1
    rewards = dones * (torch.rand(e, t, generator=g) > 0.5)
    return RolloutBatch(sel, pairs, beh, raw, lps.reshape(e, t), lpb.reshape(e, t),
                        torch.rand(e, t, state_dim(v), generator=g), rewards, dones)


def time_update(device: str, n_transitions: int = 4096, repeats: int = 3) -> list[float]:
    """Wall times of `repeats` HAPPO updates (configs/sim-stylised.yaml settings) on `device`, after one warm-up."""
    cfg = load_config("sim-stylised")
    v, t = cfg.env.n_agents, cfg.env.n_rounds
    torch.set_num_threads(cfg.run.torch_threads)
    policy = make_policy(cfg)
    batch = _update_batch(policy, v, t, n_transitions // t)
    learner = HAPPO(policy, Critic(state_dim(v), cfg.policy.critic_hidden), cfg.happo, device)
    sync = torch.cuda.synchronize if learner.device.type == "cuda" else (lambda: None)
    learner.update(batch, torch.Generator().manual_seed(1))  # warm-up (CUDA context, kernels, allocator)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        learner.update(batch, torch.Generator().manual_seed(1))
        sync()
        times.append(time.perf_counter() - t0)
    return times


def bench_update(n_transitions: int = 4096, repeats: int = 3) -> None:
    cfg = load_config("sim-stylised")
    times = time_update("cpu", n_transitions, repeats)
    h = cfg.happo
    print(f"HAPPO update, {n_transitions} transitions ({h.update_epochs} epochs x {h.num_minibatches} minibatches, "
          f"2 actors + critic, {cfg.run.torch_threads} thread): median {statistics.median(times):.3f} s "
          f"(min {min(times):.3f}) -> target < 1 s: {'OK' if statistics.median(times) < 1 else 'MISSED'}")


def bench_update_devices(n_transitions: int = 4096, repeats: int = 5) -> None:
    """HAPPO update time on CPU next to CUDA (or 'no GPU'), same batch and settings."""
    cpu = statistics.median(time_update("cpu", n_transitions, repeats))
    if torch.cuda.is_available():
        gpu = statistics.median(time_update("cuda", n_transitions, repeats))
        gpu_text = f"cuda ({torch.cuda.get_device_name()}) {gpu:.3f} s ({cpu / gpu:.1f}x)"
    else:
        gpu_text = "cuda: no GPU (torch.cuda.is_available() is False)"
    print(f"HAPPO update, {n_transitions} transitions, configs/sim-stylised.yaml settings, median of {repeats}: "
          f"cpu {cpu:.3f} s | {gpu_text}")


def bench_sim_rollouts(episodes: int = 256, envs_per_worker: int = 64) -> None:
    import ray

    from train.workers import RayPool

    results = {}
    for workers in (1, 2):
        cfg = load_config("sim-stylised", [f"rollout.num_workers={workers}", f"rollout.envs_per_worker={envs_per_worker}",
                                  f"rollout.episodes_per_iter={episodes}", "rollout.worker_num_cpus=0.5"])
        pool = RayPool(cfg)
        weights = make_policy(cfg).state_dict()
        pool.collect(weights, make_chunks(cfg, 0))  # warm-up (imports, encoder, first calls)
        t0 = time.perf_counter()
        rep = pool.collect(weights, make_chunks(cfg, 1))
        wall = time.perf_counter() - t0
        steps = sum(r.batch.rewards.numel() for r in rep.results)
        results[workers] = steps / wall
        print(f"[synthetic] sim rollouts, {workers} Ray worker(s): {steps} env steps ({episodes} debates) in "
              f"{wall:.2f} s -> {steps / wall:.0f} env steps/s ({episodes / wall * 60:.0f} debates/min)")
        pool.close()
    ray.shutdown()
    print(f"[synthetic] speed-up 2 vs 1 workers: {results[2] / results[1]:.2f}x")


def bench_embedded(episodes: int = 2, max_tokens: int = 256) -> None:
    """One HAPPO iteration on the embedded model, in-process (num_workers=0): LLM vs everything else."""
    from train.runner import Trainer

    cfg = load_config("gsm8k", ["rollout.num_workers=0", f"rollout.episodes_per_iter={episodes}",
                                f"rollout.envs_per_worker={episodes}", f"llm.max_tokens={max_tokens}",
                                "run.iterations=1", "run.out_dir=/tmp/dear_bench_runs", "logging.progress=false"])
    tr = Trainer(cfg)
    res = tr.train()
    tr.close()
    m = res.last_metrics
    share = m["time/llm_share_of_iteration"]
    print(f"embedded model, 1 iteration of {episodes} debates: {m['time/iteration_s']:.1f} s, "
          f"LLM generation {share * 100:.1f} %, outside generation {(1 - share) * 100:.1f} % "
          f"(update {m['time/update_s']:.3f} s) -> target <= 5 %: {'OK' if 1 - share <= 0.05 else 'MISSED'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python bench/bench_happo.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedded", action="store_true", help="also time one iteration on the embedded model")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--update-devices", action="store_true", help="only: update time on CPU next to CUDA")
    args = ap.parse_args()
    if args.update_devices:
        bench_update_devices()
        raise SystemExit(0)
    bench_update()
    if not args.skip_ray:
        bench_sim_rollouts()
    if args.embedded:
        bench_embedded()
