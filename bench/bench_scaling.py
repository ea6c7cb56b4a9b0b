"""Rollout throughput with 1, 2 and 4 Ray workers against an OpenAI-compatible server with per-token latency.

    taskset -c 1 python bench/bench_scaling.py                        # writes docs/scaling.png + docs/SCALING.md
    taskset -c 1 python bench/bench_scaling.py --workers 1,2 --episodes 16 --no-write

What runs: the trainer's real rollout path (`train.workers.RayPool.collect`: Ray rollout actors, each with a
vector env of debates, and one shared `LLMEngine` actor owning an `openai:` backend) against
`bench/latency_server.py`, which sleeps `--ms-per-token` per completion token (asyncio, no CPU burn), the way
a GPU server with continuous batching answers concurrent requests in about the same time as one. Every
setting collects the same debates (same seeds): only the number of workers changes. The encoder is the cheap
`hashing` one so the measurement is about overlapping LLM waits, not MiniLM on a shared CPU; the policy is
freshly initialised (the actions do not change the stand-in's latency). The pools of all worker counts live at
once (their timed collects alternate), so Ray CPU shares are 0.1 per actor: 10 actors fit on this 2-core
machine's Ray resources (shares are scheduling labels, not cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ScalingPoint:
    workers: int
    walls_s: list[float]  # every timed collect, in the order run
    debates: int
    env_steps: int
    completion_tokens: int  # decoded by the stand-in server during one timed collect
    max_in_flight: int  # most requests the stand-in held at once
    llm_bound_s: float  # the wall time if nothing but the stand-in's sleeps took time

    @property
    def wall_s(self) -> float:
        return statistics.median(self.walls_s)

    @property
    def debates_per_s(self) -> float:
        return self.debates / self.wall_s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_latency_server(port: int, ms_per_token: float, tokens: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "latency_server.py"), "--port", str(port),
                             "--ms-per-token", str(ms_per_token), "--tokens", str(tokens)])
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("the latency server did not start")


def make_config(url: str, workers: int, episodes: int, envs_per_worker: int, max_tokens: int):
    from train.config import load_config

    cfg = load_config("sim-stylised", [
        "llm.preset=openai", f"llm.url={url}", f"llm.max_tokens={max_tokens}", "env.encoder=hashing",
        f"rollout.num_workers={workers}", f"rollout.envs_per_worker={envs_per_worker}", "rollout.group_size=1",
        f"rollout.episodes_per_iter={episodes}", "rollout.worker_num_cpus=0.1", "rollout.engine_num_cpus=0.1",
        "llm.placement=engine"])
    cfg.llm.options = {"max_concurrency": 64}  # sim-stylised.yaml's options are the sim's; the HTTP client gets its own
    return cfg


def run_all(url: str, stats_url: str, workers: list[int], episodes: int, envs_per_worker: int, tokens: int,
            ms_per_token: float, repeats: int) -> list[ScalingPoint]:
    """One pool per worker count, all alive at once; the timed collects go round-robin over the pools so
    that a change in the machine's load hits every setting alike."""
    from train.build import make_policy
    from train.workers import RayPool, make_chunks

    cfgs = {w: make_config(url, w, episodes, envs_per_worker, tokens) for w in workers}
    pools = {}
    try:
        for w in workers:
            pools[w] = RayPool(cfgs[w])
            pools[w].collect(make_policy(cfgs[w]).state_dict(), make_chunks(cfgs[w], 0))  # warm-up
        walls: dict[int, list[float]] = {w: [] for w in workers}
        tokens_done, peak, steps = {}, {}, {}
        for rep in range(repeats):
            for w in workers:
                cfg, pool = cfgs[w], pools[w]
                httpx.post(stats_url + "/reset")
                t0 = time.perf_counter()
                report = pool.collect(make_policy(cfg).state_dict(), make_chunks(cfg, 1 + rep))
                walls[w].append(time.perf_counter() - t0)
                after = httpx.get(stats_url).json()
                tokens_done[w], peak[w] = after["completion_tokens"], max(peak.get(w, 0), after["max_in_flight"])
                steps[w] = sum(r.batch.rewards.numel() for r in report.results)
                if any(e.failed for r in report.results for e in r.episodes):
                    raise RuntimeError("some debates failed: the measurement would be wrong")
                print(f"  repeat {rep}: {w} worker(s) {walls[w][-1]:.2f} s", flush=True)
    finally:
        for pool in pools.values():
            pool.close()
    n_chunks = -(-episodes // envs_per_worker)
    rounds = cfgs[workers[0]].env.n_rounds + 1
    return [ScalingPoint(workers=w, walls_s=[round(x, 3) for x in walls[w]], debates=episodes, env_steps=steps[w],
                         completion_tokens=tokens_done[w], max_in_flight=peak[w],
                         llm_bound_s=-(-n_chunks // w) * rounds * tokens * ms_per_token / 1000) for w in workers]


def table(points: list[ScalingPoint]) -> str:
    base = points[0].debates_per_s
    rows = ["| Ray workers | wall s (median) | all runs s | LLM-bound minimum s | debates/s | completion tok/s "
            "| speed-up vs 1 | peak requests in flight |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for p in points:
        rows.append(f"| {p.workers} | {p.wall_s:.2f} | {', '.join(f'{x:.1f}' for x in p.walls_s)} | "
                    f"{p.llm_bound_s:.1f} | {p.debates_per_s:.2f} | {p.completion_tokens / p.wall_s:.0f} | "
                    f"{p.debates_per_s / base:.2f}x | {p.max_in_flight} |")
    return "\n".join(rows)


def plot(points: list[ScalingPoint], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.workers for p in points]
    speed = [p.debates_per_s / points[0].debates_per_s for p in points]
    fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
    ax.plot(xs, xs, "--", color="grey", label="linear")
    ax.plot(xs, speed, "o-", color="tab:blue", label="measured")
    for x, s in zip(xs, speed):
        ax.annotate(f"{s:.2f}x", (x, s), textcoords="offset points", xytext=(6, -12))
    ax.set_xticks(xs)
    ax.set_xlabel("Ray rollout workers")
    ax.set_ylabel("rollout throughput / 1 worker")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/bench_scaling.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2,4", help="comma-separated worker counts (the first is the baseline)")
    p.add_argument("--episodes", type=int, default=32, help="debates per timed collect (same seeds everywhere)")
    p.add_argument("--envs-per-worker", type=int, default=4, help="debates per chunk (one vector env batch)")
    p.add_argument("--ms-per-token", type=float, default=20.0, help="the stand-in server's decode time per token")
    p.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="timed collects per setting (median reported)")
    p.add_argument("--out-dir", default=str(ROOT / "docs"), help="where scaling.png and SCALING.md go")
    p.add_argument("--no-write", action="store_true", help="print only")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    workers = [int(w) for w in a.workers.split(",")]
    command = " ".join(["taskset -c 1 python bench/bench_scaling.py", *(shlex.quote(x) for x in (argv or sys.argv[1:]))])
    load_before = os.getloadavg()[0]
    port = _free_port()
    server = start_latency_server(port, a.ms_per_token, a.tokens)
    try:
        import ray

        points = run_all(f"http://127.0.0.1:{port}/v1#latency-sim", f"http://127.0.0.1:{port}/stats", workers,
                         a.episodes, a.envs_per_worker, a.tokens, a.ms_per_token, a.repeats)
        ray.shutdown()
    finally:
        server.terminate()
        server.wait(timeout=30)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "n/a"
    setting = (f"{a.episodes} debates (V=3, R=2) per collect, {a.envs_per_worker} per chunk, "
               f"{a.tokens} tokens x {a.ms_per_token:g} ms per request, CPU affinity {affinity}, 1-minute load "
               f"average of the 2-core machine {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end")
    text = table(points)
    print(f"\n{command}\n{setting}\n\n{text}")
    if not a.no_write:
        out = Path(a.out_dir)
        plot(points, out / "scaling.png", f"Rollout scaling, stand-in server {a.ms_per_token:g} ms/token")
        (out / "SCALING.md").write_text(
            f"# Rollout scaling: 1, 2, 4 Ray workers (measured here)\n\n"
            f"Command: `{command}`\n\nSetting: {setting}. Wall time is the median of {a.repeats} collects after "
            f"a warm-up per setting, run round-robin over the settings; every setting collects the same seeded "
            f"debates. 'LLM-bound minimum' = chunks per worker x rounds x tokens x ms/token: the wall time if only "
            f"the stand-in's sleeps took time.\n\n{text}\n\n![scaling](scaling.png)\n\n"
            f"Raw: `{json.dumps([asdict(x) for x in points])}`\n")
        print(f"wrote {out / 'scaling.png'} and {out / 'SCALING.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
