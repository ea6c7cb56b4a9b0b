"""A wide round 0 (a bank build's questions) with each question's prompt read once for all its samples, against once
per sample.

    python bench/bench_shared_prompt.py --llm local --profile pot --questions 2 --samples 9   # the embedded model
    python bench/bench_shared_prompt.py --llm smoke                                          # plumbing

Both modes run the debate engine's round 0 of `--samples` agents on GSM8K test questions at T 0.7, top-p 0.9, with
log-probabilities, as `python -m dear.bank build` does: `separate` sends one request per sample (each sample its own
derived seed, each slot reading the prompt), `shared` numbers the samples from one seed (`DebateConfig.shared_prompt`),
so llama.cpp reads the prompt once and copies its KV state to the other slots (`n_cmpl`). The modes take turns over
the seeded subset's first 2 x `--questions` questions (separate, shared, separate, ...), so a drift of the machine's
speed hits both alike and neither reads a prompt the other left in a slot's cache (a question runs once). The
questions and samples differ between the modes, so besides seconds per question the benchmark prints the prompt
tokens the server read and the seconds per 1,000 completion tokens. Prints each mode's totals and the ratios
shared / separate, measured in this one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dear import tasks  # noqa: E402
from dear.cli import require_at_least  # noqa: E402
from dear.cli import run as run_cli  # noqa: E402
from dear.debate.cli_args import add_backend_args  # noqa: E402
from dear.debate.engine import DebateConfig, DebateEngine  # noqa: E402
from dear.debate.profiles import STYLES, AgentProfile  # noqa: E402
from dear.debate.protocols import MajorityProtocol  # noqa: E402
from dear.llm.registry import make_backend, options_for  # noqa: E402

PROG = "python bench/bench_shared_prompt.py"
MODES = ("separate", "shared")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_args(p, llm="smoke", max_tokens=384, n_ctx=1024)
    p.add_argument("--profile", choices=STYLES, default="cot", help="the agents' reply style (default %(default)s)")
    p.add_argument("--questions", type=int, default=2, help="GSM8K test questions per mode (default %(default)s)")
    p.add_argument("--samples", type=int, default=9, help="samples per question (= slots; default %(default)s)")
    args = p.parse_args(argv)
    require_at_least(args, 1, "questions", "samples", "max_tokens")
    backend = make_backend(args.llm, **options_for(args.llm, {"n_parallel": args.samples, "n_ctx": args.n_ctx}))
    questions = tasks.load("gsm8k", split="test", n=2 * args.questions, seed=0)
    profiles = None if args.profile == "cot" else (AgentProfile(style=args.profile),)
    totals = {m: {"wall_s": 0.0, "prompt_read": 0, "completion": 0, "failed": 0} for m in MODES}
    try:
        for k, question in enumerate(questions):
            mode = MODES[k % 2]
            cfg = DebateConfig(n_agents=args.samples, n_rounds=0, max_tokens=args.max_tokens, logprobs=5,
                               agent_profiles=profiles, shared_prompt=mode == "shared")
            read_before = backend.server_timings.prompt_tokens
            started = time.perf_counter()
            (debate,) = DebateEngine(backend, cfg).run([question], MajorityProtocol())
            t = totals[mode]
            t["wall_s"] += time.perf_counter() - started
            t["prompt_read"] += backend.server_timings.prompt_tokens - read_before
            t["completion"] += sum(turn.completion_tokens for turn in debate.trace.rounds[0])
            t["failed"] += int(debate.failed)
    finally:
        backend.close()
    print(f"{backend.model_id}: round 0 of {args.samples} `{args.profile}` samples on {args.questions} GSM8K test "
          f"question(s) per mode, max {args.max_tokens} tokens, log-probabilities on")
    for mode in MODES:
        t = totals[mode]
        print(f"  {mode:8s}: {t['wall_s'] / args.questions:6.1f} s/question, prompt tokens read "
              f"{t['prompt_read'] / args.questions:6.0f}/question, {t['completion'] / args.questions:6.0f} completion "
              f"tokens/question, {1000 * t['wall_s'] / max(1, t['completion']):5.1f} s per 1,000 completion tokens, "
              f"{t['failed']} failed question(s)")
    s, d = totals["shared"], totals["separate"]
    print(f"  ratio shared / separate: {s['wall_s'] / d['wall_s']:.3f} in wall time, "
          f"{s['prompt_read'] / max(1, d['prompt_read']):.3f} in prompt tokens read, "
          f"{(s['wall_s'] / max(1, s['completion'])) / (d['wall_s'] / max(1, d['completion'])):.3f} in seconds per "
          f"completion token")
    return 0 if not (s["failed"] or d["failed"]) else 1


if __name__ == "__main__":
    run_cli(main, PROG)
