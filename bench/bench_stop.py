"""How fast a local backend stops while its slots are still reading long prompts.

    python bench/bench_stop.py                     # smoke model (SmolLM2-135M), 2 slots, 1 thread
    python bench/bench_stop.py --llm local --prompt-words 1500

A stop (Ctrl-C on `eval.run`, `backend.close()`) cancels the requests inside llama.cpp from the streaming
callback. Without prompt-progress chunks that callback first runs at a request's first token, so a stop waits
until every slot has read its whole prompt; with them (the default, `progress_chunks=True`) it runs after each
prompt batch. Both modes get the same requests and are stopped the same number of seconds after they start;
the ratio printed is close() time without progress chunks over close() time with them.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dear.cli import run as run_cli
from dear.debate.cli_args import OMIT, add_backend_args
from dear.llm.base import ChatMessage, ChatRequest
from dear.llm.local import CANCELLED
from dear.llm.registry import make_backend

PROG = "python bench/bench_stop.py"


def long_requests(n: int, words: int) -> list[ChatRequest]:
    """`n` distinct prompts of about 3 * `words` tokens (distinct, so no slot reuses another's prompt cache)."""
    body = " ".join(f"item{i} apple banana" for i in range(words))
    return [ChatRequest((ChatMessage("user", f"Request {k}. {body} Summarise the list."),), max_tokens=32,
                        temperature=0.0, seed=k) for k in range(n)]


def time_close(llm: str, progress_chunks: bool, args: argparse.Namespace) -> tuple[float, int]:
    """Seconds close() took, stopped `--stop-after` seconds into the batch, and how many requests it cancelled."""
    backend = make_backend(llm, n_parallel=args.slots, n_ctx=args.n_ctx, n_threads=args.threads,
                           progress_chunks=progress_chunks)
    done: dict[str, list] = {}
    worker = threading.Thread(target=lambda: done.setdefault("out", backend.generate(
        long_requests(args.slots, args.prompt_words))))
    worker.start()
    time.sleep(args.stop_after)
    t0 = time.perf_counter()
    backend.close()
    worker.join()
    return time.perf_counter() - t0, sum(c.error == CANCELLED for c in done["out"])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_backend_args(p, llm="smoke", llm_note="a llama.cpp one here: smoke, local or local:PATH.gguf",
                     max_tokens=OMIT, parallel=OMIT, n_ctx=8192)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt-words", type=int, default=1000, help="~3 tokens each")
    p.add_argument("--stop-after", type=float, default=3.0, help="seconds between the start and close()")
    args = p.parse_args(argv)
    rows = {}
    for progress in (False, True):
        seconds, cancelled = time_close(args.llm, progress, args)
        rows[progress] = seconds
        print(f"progress_chunks={progress!s:5}  close() took {seconds:7.1f} s  ({cancelled}/{args.slots} cancelled)")
    print(f"stop latency ratio (without / with progress chunks): {rows[False] / max(rows[True], 1e-9):.1f}x")


if __name__ == "__main__":
    run_cli(main, PROG)
