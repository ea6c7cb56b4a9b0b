"""The cost of repeatable decoding: llama.cpp's parallel slots vs a repeatable backend, on the same work.

    python bench/bench_repeatable.py                                  # the embedded model (--llm local)
    python bench/bench_repeatable.py --llm smoke --max-tokens 32      # plumbing

A repeatable backend (`LocalLlamaBackend(repeatable=True)`, what `dear.infer` uses by default) decodes one request
at a time without prompt-cache reuse, so a seed gives the same texts whatever else is in flight; parallel slots
decode the requests together and reuse the KV cache of a shared prefix. Two workloads, each run on both backends:

1. batch: V x questions independent GSM8K requests (sampled, each with its own seed) in one call;
2. debates: the same questions debated with MAD in lockstep (`DebateEngine.run`, as `dear.infer` runs them): the
   exchange round's prompts repeat round 0, which slots read from their cache and a repeatable backend reads again.

Modes alternate (slots, repeatable, slots, ...) so that a drift of the machine's speed hits both alike. Prints each
mode's completion tokens/s summed over the repeats and the ratio repeatable / slots, measured in this one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench_backend import gsm8k_requests  # noqa: E402  (this folder is on sys.path when run as a script)
from dear import tasks  # noqa: E402
from dear.cli import run as run_cli  # noqa: E402
from dear.debate import DebateConfig, DebateEngine, MADProtocol  # noqa: E402
from dear.debate.cli_args import OMIT, add_backend_args  # noqa: E402
from dear.llm.base import Backend  # noqa: E402
from dear.llm.registry import make_backend, uses_llama_cpp  # noqa: E402

PROG = "python bench/bench_repeatable.py"
MODES = ("slots", "repeatable")


def batch_work(backend: Backend, n: int, max_tokens: int) -> tuple[int, float]:
    """Completion tokens and wall seconds of `n` independent sampled requests in one call."""
    requests = gsm8k_requests(n, max_tokens, temperature=0.7)
    t0 = time.perf_counter()
    out = backend.generate(requests)
    return sum(c.completion_tokens for c in out), time.perf_counter() - t0


def debate_work(backend: Backend, questions, config: DebateConfig) -> tuple[int, float]:
    """Completion tokens and wall seconds of MAD debates on `questions`, rounds in lockstep."""
    engine = DebateEngine(backend, config)
    protocol = MADProtocol(config.n_agents, config.n_rounds, config.temperature0, config.top_p0)
    t0 = time.perf_counter()
    debates = engine.run(questions, protocol)
    wall = time.perf_counter() - t0
    return sum(t.completion_tokens for d in debates for r in d.trace.rounds for t in r), wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_args(p, llm="local", llm_note="a llama.cpp spec (local, local:FILE.gguf, smoke)", max_tokens=64,
                     parallel=OMIT, n_ctx=2048)
    p.add_argument("--questions", type=int, default=1, help="GSM8K questions (default %(default)s)")
    p.add_argument("--n-agents", type=int, default=3, help="agents V per debate (default %(default)s)")
    p.add_argument("--n-rounds", type=int, default=1, help="exchange rounds after round 0 (default %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="slots/repeatable pairs (default %(default)s)")
    args = p.parse_args(argv)
    if not uses_llama_cpp(args.llm):
        p.error(f"--llm {args.llm}: repeatable decoding is a llama.cpp setting; give local, local:FILE.gguf or smoke")
    n = args.questions * args.n_agents
    backends = {"slots": make_backend(args.llm, n_parallel=n, n_ctx=args.n_ctx),
                "repeatable": make_backend(args.llm, n_parallel=1, n_ctx=args.n_ctx, repeatable=True)}
    questions = tasks.load("gsm8k", n=args.questions, seed=0)
    config = DebateConfig(n_agents=args.n_agents, n_rounds=args.n_rounds, max_tokens=args.max_tokens)
    totals = {(work, mode): [0, 0.0] for work in ("batch", "debates") for mode in MODES}
    try:
        backends["slots"].generate(gsm8k_requests(1, 4))  # warm-up
        for _ in range(args.repeats):
            for mode in MODES:
                for work, (tokens, wall) in (("batch", batch_work(backends[mode], n, args.max_tokens)),
                                             ("debates", debate_work(backends[mode], questions, config))):
                    totals[work, mode][0] += tokens
                    totals[work, mode][1] += wall
    finally:
        for backend in backends.values():
            backend.close()
    print(f"{backends['slots'].model_id}: {args.questions} question(s) x {args.n_agents} agents, max {args.max_tokens} "
          f"tokens a reply, {args.repeats} pair(s); slots = {n} parallel slots, repeatable = one request at a time")
    for work, what in (("batch", f"batch of {n} requests"), ("debates", f"MAD debates, {args.n_rounds} round(s)")):
        rate = {mode: tokens / wall if wall else float("nan") for (w, mode), (tokens, wall) in totals.items()
                if w == work}
        print(f"  {what}:")
        for mode in MODES:
            tokens, wall = totals[work, mode]
            print(f"    {mode:10s} {tokens:5d} tokens in {wall:6.1f} s = {rate[mode]:6.1f} tok/s")
        print(f"    ratio repeatable / slots: {rate['repeatable'] / rate['slots']:.3f}")
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
