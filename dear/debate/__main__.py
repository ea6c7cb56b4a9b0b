"""Run built-in debate protocols on a benchmark: `python -m dear.debate --task gsm8k --n 5 --protocol mad`.

Prints per-question answers, correctness, tokens and wall time, then a summary. Responses are cached on
disk by default (a repeated run makes no model calls); --no-cache for fresh samples. A mixed pool is either a
comma-separated --llm (one spec per agent) or --agent-profiles (each agent's backend, reply style and token
limit, dear/debate/profiles.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

from tqdm import tqdm

from dear import tasks
from dear.cli import USER_ERRORS
from dear.cli import run as run_cli
from dear.debate.cli_args import add_backend_args, add_debate_args, add_output_args, add_question_args, n_agents_of
from dear.debate.engine import DebateConfig, DebateEngine, summarize
from dear.debate.profiles import AgentProfile, backend_specs, on_backend
from dear.debate.protocols import PROTOCOLS, make_protocol
from dear.debate.trace import write_jsonl
from dear.integrity import check_output_file
from dear.llm.base import Backend, BackendError
from dear.llm.cache import CachedBackend
from dear.llm.model_files import default_cache_dir
from dear.llm.registry import make_backend, uses_llama_cpp

PROG = "python -m dear.debate"
# A user error, a backend that cannot be built or reached, an unreadable file: one line, exit code 2.
ERRORS = (*USER_ERRORS, BackendError, OSError)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_question_args(p, n=5, data_seed=0)
    p.add_argument("--protocol", default="mad", help=f"one of {', '.join(PROTOCOLS)} (random:<p> for a probability)")
    backend = add_backend_args(p, llm_note="a comma-separated list gives one spec per agent (heterogeneous debate)",
                               parallel_note="default: questions x agents, at most 16", speculative=True,
                               agent_profiles=True)
    cache = backend.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=Path, default=None,
                       help="response cache file (default: $DEAR_CACHE_DIR or ~/.cache/dear, responses.sqlite)")
    cache.add_argument("--no-cache", action="store_true", help="always call the model")
    add_debate_args(p, n_agents=None, n_agents_note="default: one per --agent-profiles, else 3", sampling=True,
                    layout=DebateConfig.layout)
    add_output_args(p, out_help="write per-debate JSONL traces here", path=True, verbose=True)
    return p.parse_args(argv)


def agent_profiles(args: argparse.Namespace) -> tuple[AgentProfile, ...] | None:
    """--agent-profiles, each naming its backend (--llm for those that name none); sets args.n_agents (default 3)."""
    if args.agent_profiles and "," in args.llm:
        raise ValueError("--llm must be one spec with --agent-profiles (the backend of profiles that name none)")
    profiles = on_backend(args.agent_profiles, args.llm) if args.agent_profiles else None
    args.n_agents = n_agents_of(profiles, args.n_agents) or 3
    return profiles


def build_backends(args: argparse.Namespace, n_requests: int, profiles: tuple[AgentProfile, ...] | None = None
                   ) -> tuple[dict[str, Backend], tuple[str, ...] | None]:
    """One backend per distinct spec (of --llm, or of the profiles), and the per-agent specs of a comma-separated
    --llm (DebateConfig.agent_backends; None otherwise)."""
    specs = [s.strip() for s in args.llm.split(",") if s.strip()]
    if len(specs) > 1 and len(specs) != args.n_agents:
        raise ValueError(f"--llm lists {len(specs)} specs but --n-agents is {args.n_agents}")
    backends: dict[str, Backend] = {}
    for spec in backend_specs(profiles) if profiles else dict.fromkeys(specs):
        kwargs = {}
        if uses_llama_cpp(spec):
            kwargs["n_parallel"] = args.parallel or max(1, min(16, n_requests))
            if args.n_ctx:
                kwargs["n_ctx"] = args.n_ctx
            if args.speculative:
                kwargs["speculative"] = args.speculative
        backend = make_backend(spec, **kwargs)
        if not args.no_cache:
            backend = CachedBackend(backend, args.cache or default_cache_dir() / "responses.sqlite")
        backends[spec] = backend
    return backends, (tuple(specs) if len(specs) > 1 else None)


def _setup(args: argparse.Namespace):
    """Everything that can fail on bad input, before any debate runs: output path, questions, protocol,
    backends (a user error raises ValueError / BackendError / OSError with a message naming the flag)."""
    if args.out:
        check_output_file(args.out, "--out")  # before any debate runs, not after
    profiles = agent_profiles(args)
    questions = tasks.load(args.task, split=args.split, n=args.n, seed=args.data_seed)
    config = DebateConfig(n_agents=args.n_agents, n_rounds=args.n_rounds, temperature0=args.temperature,
                          top_p0=args.top_p, max_tokens=args.max_tokens, seed=args.seed, layout=args.layout,
                          agent_profiles=profiles)
    protocol = make_protocol(args.protocol, config)
    t_load = time.perf_counter()
    backends, agent_backends = build_backends(args, len(questions) * args.n_agents, profiles)
    if agent_backends:
        config = dataclasses.replace(config, agent_backends=agent_backends)
    return questions, config, protocol, backends, time.perf_counter() - t_load


def _fmt(keys) -> str:
    return "[" + ",".join("-" if k is None else str(k) for k in keys) + "]"


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    questions, config, protocol, backends, load_s = _setup(args)
    engine = DebateEngine(backends, config)

    profiles = f" ({', '.join(p.name for p in config.agent_profiles)})" if config.agent_profiles else ""
    print(f"{args.task}: {len(questions)} questions, protocol={protocol.name}, agents={args.n_agents}{profiles}, "
          f"rounds={protocol.n_rounds}, llm={args.llm} ({', '.join(sorted(set(engine.model_ids)))})", flush=True)
    t0 = time.perf_counter()
    with tqdm(total=protocol.n_rounds + 1, desc="rounds", unit="round", file=sys.stderr) as bar:
        debates = engine.run(questions, protocol, on_round=lambda r, ds: bar.update(1))
    wall = time.perf_counter() - t0
    try:
        for i, d in enumerate(debates, 1):
            tr = d.trace
            per_round = " ".join(f"r{r}={_fmt(keys)}" for r, keys in enumerate(tr.answer_keys()))
            status = "FAILED " + (tr.error or "") if tr.failed else ("correct" if tr.final_correct else "wrong")
            print(f"[{i}/{len(debates)}] {tr.question_id}: gold={tr.gold} final={tr.final_answer}"
                  f"{' (tie)' if tr.tie else ''} {status} | {per_round} | tokens={tr.total_tokens} "
                  f"(prompt {tr.prompt_tokens}, completion {tr.completion_tokens}) | "
                  # critical path of this debate inside the batched calls: the slowest agent of each round
                  f"latency {sum(max(t.latency_s for t in r) for r in tr.rounds if r):.1f}s")
        s = summarize(debates)
        st = engine.stats
        print("\nsummary")
        print(f"  accuracy          {s.accuracy:.3f} (ties as expected values; seeded pick {s.correct}/{s.n})")
        n = max(1, s.n)
        print(f"  tokens/question   {s.tokens_per_question:.0f} (prompt {s.prompt_tokens / n:.0f} + completion "
              f"{s.completion_tokens / n:.0f}; totals over {s.n} questions: {s.prompt_tokens} + {s.completion_tokens})")
        print(f"  failures          {s.failed}")
        print(f"  ties              {s.ties}")
        print(f"  no-answer turns   {s.no_answer_turns}/{s.turns}")
        print(f"  cache hits        {s.cached_turns}/{s.turns}" + ("" if not args.no_cache else " (cache off)"))
        print(f"  KV-cache reuse    {st.reused_prompt_tokens} of {st.prompt_tokens} prompt tokens (totals)")
        print(f"  context overflows {st.truncations}")
        print(f"  wall time         {wall:.1f}s ({wall / max(1, s.n):.1f}s/question; model load {load_s:.1f}s; "
              f"{st.generate_calls} generate calls, {st.fresh_completion_tokens / max(st.backend_s, 1e-9):.1f} decoded tok/s)")
        if args.out:
            n = write_jsonl([d.trace for d in debates], args.out)
            print(f"  traces            {n} -> {args.out}")
    finally:
        for b in backends.values():
            b.close()
    return 1 if s.failed else 0


if __name__ == "__main__":
    run_cli(main, PROG, errors=ERRORS)
