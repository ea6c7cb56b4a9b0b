"""Engine overhead benchmark: does the debate engine keep the backend busy?

Runs a MAD debate through the engine and, after each round, replays exactly the batch the engine sent as a raw
`backend.generate` call (interleaved, so both measurements see the same load on a shared machine). Reports
  * decode throughput inside the engine vs the raw batch calls (completion tokens / wall s; target >= 0.9),
  * the share of the engine's wall time spent outside the backend (prompt building, parsing, grading,
    token counting; target <= 2 %).
No response cache: every request is decoded.

    python bench/bench_engine.py                 # embedded model, 3 GSM8K questions
    python bench/bench_engine.py --llm smoke     # SmolLM2-135M, fast
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import replace

from dear import tasks
from dear.cli import run as run_cli
from dear.debate import DebateConfig, DebateEngine, MADProtocol, summarize
from dear.debate.cli_args import OMIT, add_backend_args, add_debate_args, add_question_args
from dear.llm.base import Backend, ChatMessage, ChatRequest, Completion
from dear.llm.registry import make_backend, options_for
from dear.llm.wrapper import BackendWrapper


class Recorder(BackendWrapper):
    """Forwards to a backend and keeps every batch it was asked for."""

    def __init__(self, inner: Backend):
        super().__init__(inner)
        self.batches: list[list[ChatRequest]] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.batches.append(list(requests))
        return self.inner.generate(requests)


def _marked(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    out = list(messages)
    k = next(i for i, m in enumerate(out) if m.role == "user")
    out[k] = ChatMessage("user", "(replay)\n" + out[k].content)
    return tuple(out)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python bench/bench_engine.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_question_args(p, split=OMIT, n=3)
    add_backend_args(p, parallel=OMIT, n_ctx=OMIT)
    add_debate_args(p, seed_note="also picks the questions")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args(argv)

    questions = tasks.load(args.task, n=args.n, seed=args.seed)
    n_req = len(questions) * args.n_agents
    t0 = time.perf_counter()
    kwargs = options_for(args.llm, {"n_parallel": min(16, n_req)})
    backend = make_backend(args.llm, **kwargs)
    load_s = time.perf_counter() - t0
    # Warm-up so neither measurement pays for first-call allocation.
    backend.generate([ChatRequest((ChatMessage("user", "Say hi."),), max_tokens=4, seed=1)])

    rec = Recorder(backend)
    engine = DebateEngine(rec, DebateConfig(n_agents=args.n_agents, n_rounds=args.n_rounds,
                                            max_tokens=args.max_tokens, seed=args.seed))
    raw = {"wall": 0.0, "tokens": 0}

    def replay_raw(round_: int, debates) -> None:
        # Replay the batch the engine just sent, right after it, so both see the same CPU contention. A short
        # marker after the system prompt stops llama.cpp from reusing the KV cache of the identical prompt it
        # has just processed (which would time decoding only); the shared system prompt prefix stays reusable,
        # as it was for the engine.
        batch = [replace(r, messages=_marked(r.messages)) for r in rec.batches[-1]]
        t0 = time.perf_counter()
        comps = backend.generate(batch)
        raw["wall"] += time.perf_counter() - t0
        raw["tokens"] += sum(c.completion_tokens for c in comps)

    debates = engine.run(questions, MADProtocol(args.n_agents, args.n_rounds), on_round=replay_raw)
    st = engine.stats
    engine_wall = st.total_s  # wall time inside start()/step(), i.e. excluding the raw replays
    engine_tokens = st.fresh_completion_tokens
    raw_wall, raw_tokens = raw["wall"], raw["tokens"]
    backend.close()

    engine_tps = engine_tokens / engine_wall
    raw_tps = raw_tokens / raw_wall
    s = summarize(debates)
    result = {
        "llm": args.llm, "model_id": backend.model_id, "questions": len(questions), "agents": args.n_agents,
        "rounds": args.n_rounds, "max_tokens": args.max_tokens, "load_s": round(load_s, 2),
        "engine_wall_s": round(engine_wall, 2), "engine_backend_s": round(st.backend_s, 2),
        "engine_completion_tokens": engine_tokens, "engine_tok_s": round(engine_tps, 2),
        "raw_wall_s": round(raw_wall, 2), "raw_completion_tokens": raw_tokens, "raw_tok_s": round(raw_tps, 2),
        "throughput_ratio": round(engine_tps / raw_tps, 3),
        "outside_backend_share": round((engine_wall - st.backend_s) / engine_wall, 4),
        "generate_calls": st.generate_calls, "accuracy": s.accuracy, "tokens_per_question": s.tokens_per_question,
        "failed": s.failed,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:28s} {v}")
        print(f"\nthroughput ratio engine/raw  {result['throughput_ratio']:.3f}  (target >= 0.9)")
        print(f"share outside backend        {100 * result['outside_backend_share']:.2f} %  (target <= 2 %)")
    return result


if __name__ == "__main__":
    run_cli(main, "python bench/bench_engine.py")
