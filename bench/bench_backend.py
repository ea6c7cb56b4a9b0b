"""Raw backend throughput: the same requests decoded one at a time vs as one batch call.

    python bench/bench_backend.py --llm smoke --batch 3 --max-tokens 64
    python bench/bench_backend.py --llm local --batch 3 --max-tokens 48     # the embedded Qwen model
    python bench/bench_backend.py --llm vllm:Qwen/Qwen2.5-1.5B-Instruct --batch 15

Prompts are GSM8K questions with the project's answer instruction; greedy decoding with per-request seeds
and `ignore`-free stopping, so both modes decode the same tokens. `measure(backend, requests)` is the
helper other benchmarks import for the raw side of a comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dear.cli import run as run_cli
from dear.debate.cli_args import OMIT, add_backend_args
from dear.llm.base import Backend, ChatMessage, ChatRequest
from dear.llm.registry import make_backend, options_for

PROG = "python bench/bench_backend.py"


@dataclass
class Throughput:
    mode: str  # "single" (one request per call, sequential) | "batch" (all requests in one call)
    requests: int
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    errors: int

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0


def measure(backend: Backend, requests: Sequence[ChatRequest], mode: str = "batch") -> Throughput:
    """Decode `requests` through `backend` as one batch call, or one call per request when mode="single"."""
    started = time.perf_counter()
    if mode == "batch":
        out = backend.generate(list(requests))
    elif mode == "single":
        out = [c for r in requests for c in backend.generate([r])]
    else:
        raise ValueError(f"mode must be 'single' or 'batch', got {mode!r}")
    wall = time.perf_counter() - started
    return Throughput(
        mode=mode,
        requests=len(requests),
        wall_s=wall,
        prompt_tokens=sum(c.prompt_tokens for c in out),
        completion_tokens=sum(c.completion_tokens for c in out),
        errors=sum(not c.ok for c in out),
    )


def gsm8k_requests(n: int, max_tokens: int, temperature: float = 0.0) -> list[ChatRequest]:
    from dear import tasks

    questions = tasks.load("gsm8k", n=n, seed=0)
    return [
        ChatRequest(
            messages=(
                ChatMessage("user", f"{tasks.render_question(q)}\n\n{tasks.format_instruction(q.kind)}"),
            ),
            temperature=temperature,
            top_p=0.9,
            max_tokens=max_tokens,
            seed=1000 + i,
        )
        for i, q in enumerate(questions)
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_args(p, llm="smoke", max_tokens=64, parallel=OMIT, n_ctx=2048)
    p.add_argument("--batch", type=int, default=3, help="requests per batch (= llama.cpp slots)")
    p.add_argument("--threads", type=int, default=None,
                   help="llama.cpp threads (default: DEAR_LLAMA_THREADS if set, else every usable core)")
    p.add_argument("--skip-single", action="store_true", help="only the batch measurement")
    p.add_argument("--json", action="store_true", help="print one JSON line per measurement")
    args = p.parse_args(argv)

    kwargs = options_for(args.llm, {"n_parallel": args.batch, "n_ctx": args.n_ctx, "n_threads": args.threads})
    t0 = time.perf_counter()
    backend = make_backend(args.llm, **kwargs)
    load_s = time.perf_counter() - t0
    requests = gsm8k_requests(args.batch, args.max_tokens)
    try:
        backend.generate(requests[:1])  # warm-up: first-touch of the weights, allocator, graph build
        results = [] if args.skip_single else [measure(backend, requests, "single")]
        results.append(measure(backend, requests, "batch"))
    finally:
        backend.close()
    print(f"{backend.model_id}: load {load_s:.1f}s, {args.batch} requests x max {args.max_tokens} tokens")
    for r in results:
        if args.json:
            print(json.dumps({**asdict(r), "tokens_per_s": r.tokens_per_s, "llm": args.llm}))
        else:
            print(
                f"  {r.mode:6s} {r.completion_tokens:5d} tokens in {r.wall_s:6.2f}s = {r.tokens_per_s:7.1f} tok/s"
                f" (prompt {r.prompt_tokens}, errors {r.errors})"
            )
    if len(results) == 2:
        print(f"  batch speed-up {results[1].tokens_per_s / max(results[0].tokens_per_s, 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
