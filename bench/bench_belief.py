"""Time the evidence core (similarity -> opinions -> Dempster-Shafer fusion) per debate-round, encoding excluded.

    python bench/bench_belief.py [--batch 256] [--n-agents 3 5 8] [--dim 384] [--reps 50] [--rule dst] [--threads 1]

A real round's LLM time is seconds, so the belief step should be a vanishing fraction of it
(target: < 1 ms per debate-round for V = 3).
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time

import torch

from dear.belief import fuse, opinions
from dear.cli import run as run_cli
from dear.evidence import pairwise_evidence

PROG = "python bench/bench_belief.py"


def make_inputs(batch: int, agents: int, dim: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h = torch.nn.functional.normalize(torch.randn(batch, agents, dim, generator=gen), dim=-1)
    c = torch.nn.functional.normalize(torch.randn(batch, agents, dim, generator=gen), dim=-1)
    mask = (torch.rand(batch, agents, agents, generator=gen) < 0.5) & ~torch.eye(agents, dtype=torch.bool)
    return {"h": h, "c": c, "mask": mask}


def one_round(h: torch.Tensor, c: torch.Tensor, mask: torch.Tensor, rule: str) -> torch.Tensor:
    fused = fuse(opinions(pairwise_evidence(h, c)), mask, rule=rule)
    return fused.evidence


def main() -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256, help="debates per call (B)")
    parser.add_argument("--n-agents", type=int, nargs="+", default=[3, 5, 8], help="V values to time")
    parser.add_argument("--dim", type=int, default=384, help="embedding dim (MiniLM: 384, BGE-M3: 1024)")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per V (median reported)")
    parser.add_argument("--rule", choices=["dst", "mean"], default="dst")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads; 1 is fastest for these tiny ops, and on a busy 2-core machine "
                             "OpenMP spin-waiting makes 2 threads ~50x slower")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"config: batch={args.batch} agents={args.n_agents} dim={args.dim} reps={args.reps} rule={args.rule} "
          f"dtype=float32 torch={torch.__version__} threads={torch.get_num_threads()} "
          f"cpu={platform.processor() or platform.machine()} python={platform.python_version()}")
    print(f"{'V':>3} {'ms/call':>9} {'us/debate-round':>16} {'ratio to 1 s':>13} {'target <1 ms':>13}")
    with torch.inference_mode():
        for agents in args.n_agents:
            inputs = make_inputs(args.batch, agents, args.dim, args.seed)
            for _ in range(5):  # warm-up: allocator, kernels
                one_round(**inputs, rule=args.rule)
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                one_round(**inputs, rule=args.rule)
                times.append(time.perf_counter() - start)
            median = sorted(times)[len(times) // 2]
            per_round_us = median / args.batch * 1e6
            verdict = "ok" if per_round_us < 1000 else "MISSED"
            print(f"{agents:>3} {median * 1e3:>9.3f} {per_round_us:>16.2f} {per_round_us / 1e6:>13.2e} {verdict:>13}")


if __name__ == "__main__":
    run_cli(main, PROG)
