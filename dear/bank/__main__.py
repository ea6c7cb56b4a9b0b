"""Sample banks of the model's real samples (dear/bank/store.py).

    python -m dear.bank build --llm local --benchmark gsm8k --split test --n 200 --samples 9
    python -m dear.bank show [--bank DIR]
    python -m dear.bank verify [--bank DIR]
    python -m dear.bank prime-cache --cache OUT/cache.sqlite --shelf gsm8k-test-cot-t0.7-p0.9-m384

`build` is resumable: stop it any time (Ctrl-C keeps the questions that finished) and run the same command again;
a larger `--n` extends the shelf with the next questions of the same seeded subset. `prime-cache` puts a shelf's
samples in a response cache under the round-0 requests they answer (dear/bank/prime.py), so a live `eval.run` with
that cache generates only what the bank does not hold (revise turns, more samples); `python -m eval.interventions
prime-cache` does the same from stored traces.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

from dear.bank.backend import DEFAULT_BANK as BANK_DIR
from dear.bank.build import DEFAULT_TOP_LOGPROBS, BuildPlan, build, model_identity
from dear.bank.store import Bank, ShelfKey
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.confidence import record_of
from dear.debate.cli_args import add_backend_args
from dear.debate.prompts import STYLES
from dear.llm.registry import options_for
from dear.tasks import task_names

PROG = "python -m dear.bank"
DEFAULT_BANK = Path(BANK_DIR)  # the embedded model's committed bank


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build or extend a shelf with a live model (resumable)")
    b.add_argument("--bank", type=Path, default=DEFAULT_BANK, help="bank directory (default %(default)s)")
    b.add_argument("--benchmark", choices=task_names(), required=True)
    b.add_argument("--split", default=None, help="the benchmark's split (default: its evaluation split)")
    b.add_argument("--n", type=int, required=True, help="questions: the first n of the split's seeded shuffle")
    b.add_argument("--samples", type=int, default=9, help="samples per question (default %(default)s)")
    b.add_argument("--profile", choices=STYLES, default="cot", help="the agents' reply style (default %(default)s)")
    b.add_argument("--temperature", type=float, default=0.7, help="(default %(default)s)")
    b.add_argument("--top-p", type=float, default=0.9, help="(default %(default)s)")
    b.add_argument("--top-logprobs", type=int, default=DEFAULT_TOP_LOGPROBS,
                   help="alternatives per token in the log-probabilities (default %(default)s)")
    b.add_argument("--subset-seed", type=int, default=0, help="seed of the question subset (default %(default)s)")
    b.add_argument("--seed", type=int, default=0, help="engine seed (default %(default)s)")
    b.add_argument("--max-in-flight", type=int, default=2, help="questions sampled at once (default %(default)s)")
    b.add_argument("--shared-prompt", action="store_true",
                   help="read each question's prompt once for all its samples (llama.cpp n_cmpl; sample i then has "
                        "sample 0's seed + i, not round-0 agent i's, so the question cannot prime an evaluation)")
    add_backend_args(b, max_tokens=384, parallel=9, n_ctx=1024)
    b.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    b.add_argument("-v", "--verbose", action="store_true", help="log each question")
    c = sub.add_parser("prime-cache", help="store a shelf's samples in a response cache under the round-0 requests they "
                                     "answer, so eval.run --cache reads its round 0 from the bank")
    c.add_argument("--bank", type=Path, default=DEFAULT_BANK, help="bank directory (default %(default)s)")
    c.add_argument("--cache", type=Path, required=True, help="response cache file (eval.run's OUT/cache.sqlite)")
    c.add_argument("--shelf", required=True, help="shelf name (python -m dear.bank show)")
    c.add_argument("--n", type=int, default=None, help="only the first n questions of the seeded subset (default: all)")
    c.add_argument("--samples", type=int, default=None,
                   help="round-0 width to prime (default: what every banked question holds)")
    c.add_argument("--seed", type=int, default=0, help="engine and subset seed of the evaluation (default 0)")
    for name, text in (("show", "list the shelves: questions, samples, accuracy, size"),
                       ("verify", "check every shelf against its manifest checksum")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--bank", type=Path, default=DEFAULT_BANK, help="bank directory (default %(default)s)")
    return p.parse_args(argv)


def show(bank: Bank) -> str:
    """One row per shelf: its size, accuracy, answer diversity (distinct answers per question, the share of samples
    with no answer), completion tokens and the mean confidence exp(mean token log-probability). With shelves at
    several temperatures of one benchmark and split, the rows are the real effect of T."""
    lines = [f"bank {bank.root}: model {bank.manifest['model_file']} (sha256 {bank.manifest['model_sha256'][:12]}…)",
             "| shelf | T | top-p | questions | samples | accuracy | distinct answers / question | no answer | "
             "completion tokens / sample | mean confidence | with confidence | MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in bank.keys:
        shelf = bank.shelf(key)
        per_question = [shelf.of(q) for q in shelf.questions]
        every = [s for samples in per_question for s in samples]
        if not every:
            continue
        acc = 100 * sum(s.correct for s in every) / len(every)
        distinct = sum(len({s.answer_key for s in samples if s.answer_key is not None}) for samples in per_question)
        unanswered = 100 * sum(s.answer_key is None for s in every) / len(every)
        comp = sum(s.completion_tokens for s in every) / len(every)
        records = [r for r in (record_of(s.confidence) for s in every) if r is not None]
        mean_conf = sum(math.exp(r.mean_logprob) for r in records) / len(records) if records else math.nan
        lines.append(f"| {key.name} | {key.temperature:g} | {key.top_p:g} | {len(shelf.questions)} | {len(every)} | "
                     f"{acc:.1f} % | {distinct / len(per_question):.2f} | {unanswered:.1f} % | {comp:.0f} | "
                     f"{mean_conf:.3f} | {len(records)} | {shelf.path.stat().st_size / 1e6:.2f} |")
    return "\n".join(lines)


def prime_from_shelf(a: argparse.Namespace) -> int:
    from dear.bank.prime import prime_cache

    bank = Bank.open(a.bank)
    key = next((k for k in bank.keys if k.name == a.shelf), None)
    if key is None:
        raise ValueError(f"--shelf {a.shelf}: not in {a.bank} (shelves: {', '.join(k.name for k in bank.keys)})")
    done = prime_cache(bank, key, a.cache, a.n, a.samples, engine_seed=a.seed, subset_seed=a.seed)
    print(f"{a.cache}: {done.added} of {done.entries} round-0 samples added ({done.questions} questions of "
          f"{key.name}, model {done.model_id})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.command == "show":
        print(show(Bank.open(a.bank)))
        return 0
    if a.command == "verify":
        bad = Bank.open(a.bank).verify()
        print("every shelf matches its checksum" if not bad else f"damaged or missing: {', '.join(bad)}")
        return 1 if bad else 0
    if a.command == "prime-cache":
        return prime_from_shelf(a)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    require_at_least(a, 1, "n", "samples", "max_tokens", "parallel", "n_ctx", "max_in_flight")
    require_at_least(a, 0, "top_logprobs")
    from dear import tasks
    from dear.llm.registry import make_backend

    split = a.split or tasks.get_task(a.benchmark).default_split or "test"
    key = ShelfKey(a.benchmark, split, a.profile, a.temperature, a.top_p, a.max_tokens)
    model_file, sha = model_identity(a.llm)
    bank = Bank.open(a.bank, model_file, sha)
    plan = BuildPlan(key, a.n, a.samples, a.subset_seed, a.seed, a.top_logprobs, a.shared_prompt)
    options = options_for(a.llm, {"n_parallel": a.parallel, "n_ctx": a.n_ctx})
    generation = {"llm": a.llm, **options, "threads": os.environ.get("DEAR_LLAMA_THREADS", "auto"),
                  "command": command_line(PROG, argv)}
    backend = make_backend(a.llm, **options)
    try:
        build(bank, plan, backend, a.max_in_flight, generation, progress=not a.quiet)
    finally:
        backend.close()
    print(show(bank))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
