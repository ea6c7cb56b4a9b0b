"""The cost of asking for log-probabilities: the same greedy requests decoded with and without them.

    python bench/bench_logprobs.py --llm local --batch 3 --max-tokens 128 --repeats 2   # the embedded model
    python bench/bench_logprobs.py --llm smoke                                           # plumbing

Both modes decode the same tokens (greedy; asking for log-probabilities changes nothing that is sampled), in
alternating order (with, without, with, ...) so that a drift of the machine's speed hits both alike. Prints each
mode's completion tokens/s summed over the repeats and the ratio with / without, measured in this one run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench_backend import gsm8k_requests, measure  # noqa: E402  (this folder is on sys.path when run as a script)
from dear.cli import run as run_cli  # noqa: E402
from dear.debate.cli_args import OMIT, add_backend_args  # noqa: E402
from dear.llm.registry import make_backend, options_for  # noqa: E402

PROG = "python bench/bench_logprobs.py"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_args(p, llm="smoke", max_tokens=64, parallel=OMIT, n_ctx=2048)
    p.add_argument("--batch", type=int, default=3, help="requests per batch call (= llama.cpp slots)")
    p.add_argument("--top-logprobs", type=int, default=5, help="alternatives per token (default %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="with/without pairs (default %(default)s)")
    args = p.parse_args(argv)
    kwargs = options_for(args.llm, {"n_parallel": args.batch, "n_ctx": args.n_ctx})
    backend = make_backend(args.llm, **kwargs)
    plain = gsm8k_requests(args.batch, args.max_tokens)
    asked = [replace(r, logprobs=args.top_logprobs) for r in plain]
    totals = {"with": [0, 0.0], "without": [0, 0.0]}
    try:
        backend.generate(plain[:1])  # warm-up
        for _ in range(args.repeats):
            for mode, requests in (("with", asked), ("without", plain)):
                t = measure(backend, requests)
                totals[mode][0] += t.completion_tokens
                totals[mode][1] += t.wall_s
    finally:
        backend.close()
    rate = {m: tokens / wall for m, (tokens, wall) in totals.items()}
    print(f"{backend.model_id}: {args.batch} greedy requests x max {args.max_tokens} tokens, {args.repeats} pairs, "
          f"top_logprobs {args.top_logprobs}")
    for mode in ("without", "with"):
        print(f"  {mode:7s} log-probabilities: {totals[mode][0]:5d} tokens in {totals[mode][1]:6.1f} s = "
              f"{rate[mode]:6.1f} tok/s")
    print(f"  ratio with / without: {rate['with'] / rate['without']:.3f}")
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
