"""`python -m eval.combine`: one report over several `eval.run` results directories (e.g. one per benchmark,
each with the token limit its benchmark needs).

    python -m eval.combine --out results/eval-real \\
        results/eval-gsm8k-n60-v2 results/eval-math500-n30-t2048 results/eval-gpqa-n30

Each directory's results are read from its traces as `python -m eval.run ... --report-only` reads them (its last
recorded command, so the same methods and questions), without rewriting anything there (a run may still be
writing it), and the results are written side by side into ``--out``:
``summary.md`` (every table of `eval.run`'s report, one column or section per benchmark), ``summary.csv``, the
plots, and ``sources.json`` (each directory with its command, so every number traces back to one).

A benchmark may come from several directories only when they ran the same questions from one stored round 0
(e.g. the paper's DEAR in one, an extended DEAR in another): the baselines both computed must then agree question
by question and are shown once. Real and synthetic (sim) directories are never combined.

`DIR:METHOD,...` takes only those methods of a directory. A directory whose agent pool differs from the first
directory's (`--agent-profiles`) may join on the same questions, paired by question (same prompts and seeds, but
not the same samples: a batched backend such as llama.cpp does not reproduce a completion across batches of other
requests): its rows say their pool in their label ("Self-consistency [pool local:cot ×3]"), and a method key the
first pool also has becomes "<key>@pool <pool>". E.g. a mixed pool beside its strongest agent's self-consistency,
measured in a homogeneous run of the same questions:

    python -m eval.combine --out results/eval-gsm8k-mixed results/eval-gsm8k-mixed-n60 \\
        results/eval-gsm8k-n60-v2:majority,sc
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from dear.atomic import write_json
from dear.cli import run as run_cli
from eval import plots, report
from eval import run as eval_run


@dataclass(frozen=True)
class Source:
    """One results directory and the `eval.run` arguments that produced it."""

    path: Path
    command: str
    argv: list[str]
    synthetic: bool
    pool: tuple[str, ...] = ()  # every agent's profile name, in seat order
    methods: tuple[str, ...] | None = None  # the methods taken from it (None = all)


def split_argument(text: str) -> tuple[Path, tuple[str, ...] | None]:
    """A positional argument `DIR` or `DIR:METHOD,...` (the part after the last colon is a method list when it holds
    no path separator)."""
    head, colon, tail = text.rpartition(":")
    if not colon or not head or "/" in tail:
        return Path(text), None
    methods = tuple(m.strip() for m in tail.split(",") if m.strip())
    if not methods:
        raise ValueError(f"{text}: no method after ':' (give DIR or DIR:METHOD,...)")
    return Path(head), methods


def pool_of(settings: dict) -> tuple[str, ...]:
    """Every seat's profile name from a run's stored settings (the default profile on --llm without a pool)."""
    n_agents = int(settings.get("n_agents") or 3)
    names = settings.get("agent_profiles") or [f"{settings.get('llm') or 'unknown'}:cot"]
    return tuple(str(names[i % len(names)]) for i in range(n_agents))


def describe_pool(pool: Sequence[str]) -> str:
    """`local:cot ×2, local:direct`: each run of equal profiles once, with its count."""
    runs: list[list] = []
    for name in pool:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ", ".join(name if count == 1 else f"{name} ×{count}" for name, count in runs)


def read_source(path: Path, methods: tuple[str, ...] | None = None) -> Source:
    """The directory's last `eval.run` command (run.json) as arguments, and its agent pool; errors name the file and
    key."""
    run_json = path / "run.json"
    if not run_json.is_file():
        raise ValueError(f"{path}: no run.json (not an eval.run results directory)")
    try:
        stored = json.loads(run_json.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{run_json}: not valid JSON ({exc})") from None
    commands = stored.get("commands") or []
    if not commands:
        raise ValueError(f"{run_json}: key 'commands' is empty; run `python -m eval.run` there first")
    command = commands[-1]
    prefix = "python -m eval.run "
    if not command.startswith(prefix):
        raise ValueError(f"{run_json}: the last command does not start with {prefix!r}: {command!r}")
    return Source(path, command, shlex.split(command[len(prefix):]), bool(stored.get("synthetic", False)),
                  pool=pool_of(stored.get("settings") or {}), methods=methods)


def report_source(source: Source) -> list[report.MethodResult]:
    """The directory's results, read from its traces (no model is loaded; nothing there is rewritten)."""
    return eval_run.read_results(source.argv + ["--out", str(source.path)])


def taken_results(source: Source, results: Sequence[report.MethodResult],
                  first_pool: tuple[str, ...]) -> tuple[list[report.MethodResult], str]:
    """The source's rows the command line takes, and its tag for a method key another source has too (its policy
    checkpoint; its pool where that differs from the first source's, which its labels then say)."""
    taken = list(results)
    if source.methods is not None:
        have = list(dict.fromkeys(r.method for r in results))
        missing = [m for m in source.methods if m not in have]
        if missing:
            raise ValueError(f"{source.path}: no method {', '.join(map(repr, missing))} in its results "
                             f"(it has {', '.join(have)})")
        taken = [r for r in results if r.method in source.methods]
    if source.pool == first_pool:
        return taken, policy_tag(source)
    pool = describe_pool(source.pool)
    return [replace(r, label=f"{r.label} [pool {pool}]") for r in taken], f"pool {pool}"


def _same_result(a: report.MethodResult, b: report.MethodResult) -> bool:
    return (a.correct_by_question == b.correct_by_question
            and a.summary.total_tokens.mean == b.summary.total_tokens.mean)


def policy_tag(source: Source) -> str:
    """What tells a source's DEAR methods apart from another source's: its --checkpoint (else its directory)."""
    argv = source.argv
    return argv[argv.index("--checkpoint") + 1] if "--checkpoint" in argv[:-1] else str(source.path)


def merge_sources(
    per_source: Sequence[tuple[Path, list[report.MethodResult], str]],
) -> tuple[list[report.MethodResult], dict[str, list[Path]]]:
    """Every source's results in one list, and the directories each benchmark came from. `per_source` holds each
    directory, its results and its tag (`taken_results`: its policy, or its pool where that is another).

    A benchmark may come from several directories when they ran the same questions from one stored round 0 (e.g.
    the paper's DEAR in one and an extended DEAR in another): a method both report must then agree on every
    question and its tokens (the shared baselines; kept once), and a method key that means two policies (both
    "dear") keeps its first label while the other becomes "<key>@<tag>". Anything else is refused, naming
    the directories."""
    merged: list[tuple[report.MethodResult, str]] = []
    origin: dict[str, list[Path]] = {}
    for path, source_results, tag in per_source:
        for r in source_results:
            paths = origin.setdefault(r.benchmark, [])
            if path not in paths:
                paths.append(path)
            earlier = [o for o, _ in merged if o.benchmark == r.benchmark]
            if earlier and set(earlier[0].correct_by_question) != set(r.correct_by_question):
                raise ValueError(f"benchmark {r.benchmark!r}: {path} and {paths[0]} report different questions; "
                                 "only directories with the same questions (one stored round 0) combine")
            same = next((o for o in earlier if (o.method, o.label) == (r.method, r.label)), None)
            if same is None:
                merged.append((r, tag))
            elif not _same_result(same, r):
                raise ValueError(f"benchmark {r.benchmark!r}: method {r.label!r} differs between {paths[0]} and "
                                 f"{path} (not the same stored round 0, or not the same settings)")
    # One row per method across benchmarks, and a policy's methods together (its random control beside its DEAR).
    first_label: dict[str, str] = {}
    for r, _ in merged:
        first_label.setdefault(r.method, r.label)
    results = [r if r.label == first_label[r.method] else replace(r, method=f"{r.method}@{tag}") for r, tag in merged]
    labels: dict[str, str] = {}
    for r in results:
        if labels.setdefault(r.method, r.label) != r.label:
            raise ValueError(f"method {r.method!r} has two labels, {labels[r.method]!r} and {r.label!r}: one "
                             "policy was evaluated under two names")
    return results, origin


def combine(paths: Sequence[Path], out: Path, seed: int = 0, n_boot: int = 2000,
            methods_of: Sequence[tuple[str, ...] | None] | None = None) -> list[report.MethodResult]:
    """The combined report of `paths` (with `methods_of`, the methods taken from each; None = all) in `out`."""
    resolved = [Path(p).resolve() for p in paths]
    twice = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if twice:
        raise ValueError(f"directory listed twice: {', '.join(twice)}")
    sources = [read_source(Path(p), methods) for p, methods in zip(paths, methods_of or [None] * len(paths))]
    if len({s.synthetic for s in sources}) > 1:
        kinds = ", ".join(f"{s.path} ({'synthetic' if s.synthetic else 'real'})" for s in sources)
        raise ValueError(f"real and synthetic results are never combined: {kinds}")
    taken = [taken_results(source, report_source(source), sources[0].pool) for source in sources]
    results, origin = merge_sources([(source.path, *t) for source, t in zip(sources, taken)])
    synthetic = sources[0].synthetic
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "sources.json",
               [{"directory": str(s.path), "command": s.command, "pool": list(s.pool),
                 "methods": list(s.methods) if s.methods is not None else "all",
                 "benchmarks": sorted(b for b, ps in origin.items() if s.path in ps)} for s in sources], indent=1)
    report.write_csv(results, out / "summary.csv")
    meta = {
        "title": "DEAR evaluation, combined" + (" (SYNTHETIC)" if synthetic else ""),
        "synthetic": synthetic,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "notes": [f"{', '.join(sorted(b for b, ps in origin.items() if s.path in ps))} from `{s.path}` "
                  + (f"(methods {', '.join(s.methods)} only) " if s.methods is not None else "")
                  + f"(pool {describe_pool(s.pool)}; its summary.md has the model, checkpoint, settings and "
                  f"failures): `{s.command}`" for s in sources],
        "generation_s": _generation_seconds(sources, origin),
        "agent_profiles": any(len(set(s.pool)) > 1 for s in sources),  # a mixed pool: the per-agent section
    }
    md = report.markdown(results, meta, seed=seed, n_boot=n_boot)
    for s, (own, _) in zip(sources, taken):  # each re-graded source's "what moved" note, of its own rows
        record = report.read_regrade_record(s.path)
        if record is not None:  # keyed as in the source (its regrade.json), not as renamed beside other sources
            keys = {f"{r.benchmark}/{r.method}": r for r in own}
            note = report.moved_note(record, {k: (r.summary.accuracy.mean, r.summary.accuracy_seeded.mean)
                                              for k, r in keys.items()},
                                     n_now={k: r.summary.n for k, r in keys.items()})
            md += "\n" + "\n".join([note[0] + f" (`{s.path}`)", *note[1:]])
    (out / "summary.md").write_text(md, encoding="utf-8")
    plots.write_all(results, out, synthetic=synthetic)
    return results


def _generation_seconds(sources: Sequence[Source], origin: dict[str, list[Path]]) -> dict[str, float]:
    """Seconds of generation per benchmark, from each directory's timings.json."""
    seconds: dict[str, float] = {}
    for s in sources:
        path = s.path / "timings.json"
        timings = json.loads(path.read_text()) if path.exists() else {}
        for key, value in timings.items():
            benchmark = key.split("/", 1)[0]
            if s.path in origin.get(benchmark, ()):
                seconds[benchmark] = seconds.get(benchmark, 0.0) + float(value)
    return seconds


def main(argv: Sequence[str] | None = None) -> list[report.MethodResult]:
    p = argparse.ArgumentParser(prog="python -m eval.combine", description=__doc__.split("\n\n")[0])
    p.add_argument("directories", nargs="+", metavar="DIR[:METHOD,...]",
                   help="eval.run results directories; after a colon, the only methods to take from one")
    p.add_argument("--out", type=Path, required=True, help="directory of the combined report")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed of the paired differences")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples")
    a = p.parse_args(argv)
    parsed = [split_argument(d) for d in a.directories]
    results = combine([d for d, _ in parsed], a.out, seed=a.seed, n_boot=a.n_boot, methods_of=[m for _, m in parsed])
    print(f"{len(results)} rows from {len(a.directories)} directories; report in {a.out / 'summary.md'}")
    return results


if __name__ == "__main__":
    run_cli(main, "python -m eval.combine")
