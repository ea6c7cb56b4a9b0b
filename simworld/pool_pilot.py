"""The pilot that chooses a mixed agent pool (issue 42): each profile's round-0 accuracy and cost on GSM8K **train**
questions, so the mixed-pool corpus uses a pool whose agents differ (round-0 accuracies >= 20 points apart).

    python -m simworld.pool_pilot --agent-profiles local:cot,local:direct,smoke:cot --n 30 --out results/pool-pilot-gsm8k

Questions: a seeded subset of the task's train split without the questions of `--exclude-corpus` (the existing
corpus, so a mixed-pool corpus drawn later from the same pool of questions stays apart from it); never a test
question. Each question gets one round 0 of the pool: every profile answers once from the question alone, at the
corpus's sampling (T 0.7, top-p 0.9) and its own token limit. Resumable: finished questions are appended to
`traces.jsonl` (one DebateTrace per line) as they end; the same command continues; a larger `--n` extends the set.
`report.md` / `report.json`: per profile, accuracy with its Wilson 95 % interval, no-answer share, completion tokens
and seconds per answer; per pair of profiles, the paired accuracy difference with a paired-bootstrap 95 % interval.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dear import tasks
from dear.atomic import write_json
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.cli_args import add_backend_args, add_output_args
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.profiles import AgentProfile, backend_specs, on_backend, parse_profiles
from dear.debate.trace import DebateTrace, read_jsonl
from dear.llm.base import Backend
from dear.llm.registry import make_backend, options_for
from dear.metrics import Ratio, paired_bootstrap_diff, wilson_ci
from dear.settings_guard import open_run_dir
from simworld.fit import load_corpus

log = logging.getLogger("simworld.pool_pilot")
PROG = "python -m simworld.pool_pilot"
TRACES_FILE = "traces.jsonl"


@dataclass(frozen=True)
class PilotSettings:
    """What a resumed run must share with the run that began it."""

    agent_profiles: list[str]
    task: str
    split: str
    seed: int
    exclude_corpus: str
    temperature: float
    top_p: float
    max_tokens: int


@dataclass(frozen=True)
class ProfileRow:
    profile: str
    n: int
    accuracy: float
    ci_low: float
    ci_high: float
    no_answer: float
    completion_tokens: float  # per answer
    seconds: float  # per answer (latency of its request; requests of one batch overlap)


def pilot_questions(task: str, split: str, n: int, seed: int, exclude_corpus: str) -> list[tasks.Question]:
    """The first n of a seeded shuffle of the split, without the excluded corpus's questions (a larger n extends
    a smaller one)."""
    excluded: set[str] = set()
    if exclude_corpus:
        corpus = load_corpus(exclude_corpus)
        excluded = {t["question_id"] for t in corpus.logging + corpus.mad}
    everything = tasks.load(task, split=split)
    shuffled = tasks.subset(everything, len(everything), seed)
    pool = [q for q in shuffled if q.id not in excluded]
    if n > len(pool):
        raise ValueError(f"--n {n}: {task}/{split} has only {len(pool)} questions outside {exclude_corpus!r}")
    return pool[:n]


def collect(out: Path, profiles: Sequence[AgentProfile], s: PilotSettings, questions: Sequence[tasks.Question],
            backends: dict[str, Backend], batch: int) -> int:
    """Run round 0 of the pool on the questions not yet in `out`, appending each batch; returns how many were added."""
    path = out / TRACES_FILE
    done = {t.question_id for t in read_jsonl(path) if not t.failed} if path.exists() else set()
    todo = [q for q in questions if q.id not in done]
    cfg = DebateConfig(n_agents=len(profiles), n_rounds=0, temperature0=s.temperature, top_p0=s.top_p,
                       max_tokens=s.max_tokens, seed=s.seed, agent_profiles=tuple(profiles))
    engine = DebateEngine(backends, cfg)
    added, t0 = 0, time.perf_counter()
    for k in range(0, len(todo), batch):
        debates = engine.start(todo[k:k + batch], n_rounds=0, protocol="pool-pilot")
        with path.open("a", encoding="utf-8") as f:
            for d in debates:  # a failed question is kept for the record and asked again next run
                f.write(d.trace.to_json() + "\n")
        added += sum(not d.failed for d in debates)
        log.info("%d/%d questions (%.0f s)", len(done) + added, len(questions), time.perf_counter() - t0)
    return added


def profile_rows(traces: Sequence[DebateTrace], names: Sequence[str]) -> list[ProfileRow]:
    rows = []
    for i, name in enumerate(names):
        turns = [t.rounds[0][i] for t in traces]
        right = Ratio(sum(a.correct for a in turns), len(turns))
        ci = wilson_ci(right)
        rows.append(ProfileRow(name, len(turns), right.num / right.den, ci.low, ci.high,
                               sum(a.answer is None for a in turns) / len(turns),
                               sum(a.completion_tokens for a in turns) / len(turns),
                               sum(a.latency_s for a in turns) / len(turns)))
    return rows


def report(out: Path, names: Sequence[str], command: str) -> str:
    """report.md and report.json from the finished questions (the latest attempt of each)."""
    latest = {t.question_id: t for t in read_jsonl(out / TRACES_FILE)} if (out / TRACES_FILE).exists() else {}
    traces = [t for t in latest.values() if not t.failed]
    if not traces:
        return "pool pilot: no finished questions yet"
    rows = profile_rows(traces, names)
    pairs = []
    for i, j in itertools.combinations(range(len(names)), 2):
        diff = paired_bootstrap_diff([float(t.rounds[0][i].correct) for t in traces],
                                     [float(t.rounds[0][j].correct) for t in traces], seed=0)
        pairs.append({"a": names[i], "b": names[j], "diff": diff.mean, "low": diff.low, "high": diff.high})
    write_json(out / "report.json", {"n": len(traces), "profiles": [asdict(r) for r in rows], "pairs": pairs},
               indent=1)
    lines = [f"# Pool pilot: round-0 accuracy per agent profile ({len(traces)} questions)", "",
             f"Command (continue with the same flags; a larger `--n` extends it): `{command}`", "",
             "| profile | accuracy % [Wilson 95 % CI] | no answer % | completion tokens / answer | s / answer |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| `{r.profile}` | {100 * r.accuracy:.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] | "
              f"{100 * r.no_answer:.1f} | {r.completion_tokens:.0f} | {r.seconds:.1f} |" for r in rows]
    lines += ["", "Paired accuracy differences (points, paired bootstrap 95 % CI, 2,000 resamples, seed 0):", "",
              "| a − b | difference |", "|---|---|"]
    lines += [f"| `{p['a']}` − `{p['b']}` | {100 * p['diff']:+.1f} [{100 * p['low']:+.1f}, {100 * p['high']:+.1f}] |"
              for p in pairs]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text, encoding="utf-8")
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent-profiles", required=True, type=parse_profiles,
                   help="the pool, [BACKEND:]STYLE[:MAX_TOKENS] per agent (e.g. local:cot,local:direct,smoke:cot)")
    p.add_argument("--task", default="gsm8k", help="task (default %(default)s); its train split is used")
    p.add_argument("--n", type=int, default=30, help="questions (default %(default)s)")
    p.add_argument("--exclude-corpus", default="results/corpus-gsm8k",
                   help="leave out this corpus's questions ('' = none; default %(default)s)")
    add_backend_args(p, max_tokens=384, parallel=3, n_ctx=2048)
    p.add_argument("--seed", type=int, default=0, help="question subset and sampling seeds (default %(default)s)")
    p.add_argument("--batch", type=int, default=3, help="questions per generate call (default %(default)s)")
    add_output_args(p, out_help="pilot directory (created; continued if it exists)",
                    out="results/pool-pilot-gsm8k", path=True, verbose=True)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, backends: dict[str, Backend] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    require_at_least(a, 1, "n", "max_tokens", "parallel", "n_ctx", "batch")
    profiles = on_backend(a.agent_profiles, a.llm)
    names = [p.name for p in profiles]
    s = PilotSettings(names, a.task, "train", a.seed, a.exclude_corpus, 0.7, 0.9, a.max_tokens)
    questions = pilot_questions(a.task, "train", a.n, a.seed, a.exclude_corpus)
    out = open_run_dir(Path(a.out), s, "use the stored settings to continue, or another --out")
    own = backends is None
    if own:
        backends = {spec: make_backend(spec, **options_for(spec, {"n_parallel": a.parallel, "n_ctx": a.n_ctx}))
                    for spec in backend_specs(profiles)}
    try:
        collect(out, profiles, s, questions, backends, a.batch)
    finally:
        if own:
            for b in backends.values():
                b.close()
        print(report(out, names, command_line(PROG, argv)))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
