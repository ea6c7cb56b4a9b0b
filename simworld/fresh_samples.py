"""New independent samples on corpus questions the fit never saw: the real side of the check that the simulator's
fresh samples, sampling rules and stop behave like the model's (issue 39, item 4).

    python -m simworld.fresh_samples --llm local --parallel 9 --out results/fresh-samples-gsm8k -v

Questions: those of `--corpus` that the dynamics fit held out — the logging-policy questions its seeded split put on
the held-out side (`--holdout`, `--split-seed`: the fit's own values by default) and every MAD question — in corpus
order; GSM8K **train** split, never a test question. Each gets one `--width`-agent round 0 (9 by default: SC-9's
samples) at the corpus's round-0 sampling (T 0.7, top-p 0.9, 384 completion tokens), with a debate seed derived
from the corpus's by a fixed salt, so every sample is new (none is a corpus completion).

Layout of `--out`: `settings.json` (guarded), `samples.jsonl.gz` (one gzip member per finished question:
`{"kind": "fresh", "question_id", "written_at", "trace"}`, the full DebateTrace of the wide round 0) and
`PROVENANCE.md`. Resumable like `simworld.corpus`: SIGINT/SIGTERM lets the questions in flight finish and be kept;
the same command continues; `--n` grows the set in corpus order. The comparison with the simulator is
`simworld.sampling_validation`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dear import tasks
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.cli_args import add_backend_args, add_output_args
from dear.debate.engine import Debate, DebateConfig, DebateEngine, default_debate_seed
from dear.debate.protocols import MajorityProtocol
from dear.llm.base import GENERATED_TOKENS, Backend
from dear.llm.registry import is_synthetic, make_backend, options_for
from dear.progress import LiveProgress
from dear.seeds import derive_seed
from dear.settings_guard import open_run_dir
from dear.tasks import Question
from simworld.corpus import CorpusFile, model_file_info
from simworld.fit import load_corpus, split_by_question

log = logging.getLogger("simworld.fresh_samples")
PROG = "python -m simworld.fresh_samples"
SAMPLES_FILE = "samples.jsonl.gz"
FRESH_SALT = 0xF5E5  # debate seed = derive_seed(corpus debate seed, FRESH_SALT): new samples, reproducibly


@dataclass(frozen=True)
class FreshSampleSettings:
    """What a resumed run must share with the run that began it."""

    corpus: str
    corpus_task: str
    corpus_split: str
    holdout: float
    split_seed: int
    llm: str
    width: int
    temperature: float
    top_p: float
    max_tokens: int
    layout: str
    seed: int


def unseen_question_ids(corpus_dir: str | Path, holdout: float, split_seed: int) -> list[str]:
    """The corpus's questions the dynamics fit never trained on (held-out logging questions, then every MAD
    question), each once, in corpus order."""
    corpus = load_corpus(corpus_dir)
    _, held = split_by_question(corpus.logging, holdout, split_seed)
    ids: list[str] = []
    for t in held + corpus.mad:
        if t["question_id"] not in ids:
            ids.append(t["question_id"])
    return ids


def questions_of(ids: Sequence[str], task: str, split: str) -> list[Question]:
    by_id = {q.id: q for q in tasks.load(task, split=split)}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"{task}/{split} has no question(s) {missing[:5]} named by the corpus")
    return [by_id[i] for i in ids]


def fresh_seed(q: Question) -> int:
    return derive_seed(default_debate_seed(q), FRESH_SALT)


def collect(out: Path, s: FreshSampleSettings, questions: Sequence[Question], backend: Backend,
            max_in_flight: int) -> int:
    """Sample the questions not yet in `out`; returns how many were added."""
    samples = CorpusFile(out / SAMPLES_FILE)
    done = {r["question_id"] for r in samples.records}
    todo = [q for q in questions if q.id not in done]
    if not todo:
        log.info("nothing to do: all %d questions are sampled", len(questions))
        return 0
    cfg = DebateConfig(n_agents=s.width, n_rounds=0, temperature0=s.temperature, top_p0=s.top_p,
                       max_tokens=s.max_tokens, seed=s.seed, layout=s.layout)
    added = {"n": 0, "failed": 0}
    t0 = time.perf_counter()
    bar = LiveProgress(len(todo), "fresh samples", unit="q", tokens=GENERATED_TOKENS.total)

    def on_done(d: Debate) -> None:
        bar.update(1)
        if d.failed:  # not recorded: the same command redoes it
            added["failed"] += 1
            log.error("question %s failed (%s); not recorded", d.question.id, d.error)
            return
        samples.append({"kind": "fresh", "question_id": d.question.id, "written_at": _utc_now(),
                        "trace": d.trace.to_dict()})
        added["n"] += 1
        log.info("%d/%d %s (%.0f s)", added["n"], len(todo), d.question.id, time.perf_counter() - t0)

    with bar:
        DebateEngine(backend, cfg).run_concurrent(todo, MajorityProtocol(), max_in_flight,
                                                  debate_seeds=[fresh_seed(q) for q in todo], on_done=on_done)
    print(f"fresh samples: {added['n']} question(s) added, {added['failed']} failed, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return added["n"]


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_provenance(out: Path, s: FreshSampleSettings, n_planned: int, command: str) -> str:
    recs = CorpusFile(out / SAMPLES_FILE).records
    dates = sorted({r.get("written_at", "") for r in recs} - {""})
    model = model_file_info(s.llm)
    synthetic = is_synthetic(s.llm)
    text = "\n".join([
        "# Fresh samples" + (" (SYNTHETIC: sim backend, not a real model)" if synthetic else ""),
        "",
        f"Command (continue with the same flags; `--n` grows it): `{command}`",
        "",
        f"- Backend: `{s.llm}`; model file `{model['file']}`, sha256 `{model['sha256']}`.",
        f"- Questions: {len(recs)} of {n_planned} planned, `{s.corpus_task}` split `{s.corpus_split}`: the "
        f"questions of `{s.corpus}` the dynamics fit held out (split seed {s.split_seed}, holdout {s.holdout}, "
        "then the MAD questions), in corpus order.",
        f"- Samples: {s.width} independent round-0 answers per question at T {s.temperature}, top-p {s.top_p}, "
        f"{s.max_tokens} max completion tokens, layout `{s.layout}`, engine seed {s.seed}, debate seed = "
        f"derive_seed(corpus debate seed, {FRESH_SALT:#x}) (none is a corpus completion).",
        f"- Collected (UTC): {dates[0] if dates else '-'} to {dates[-1] if dates else '-'}.",
        f"- Files: `{SAMPLES_FILE}` (gzip members, one JSON record per question with its full DebateTrace), "
        "`settings.json` (the settings guard).",
        "",
    ])
    (out / "PROVENANCE.md").write_text(text, encoding="utf-8")
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="results/corpus-gsm8k", help="the fitted corpus (default %(default)s)")
    p.add_argument("--holdout", type=float, default=0.2, help="the fit's held-out share (default %(default)s)")
    p.add_argument("--split-seed", type=int, default=0, help="the fit's split seed (default %(default)s)")
    p.add_argument("--n", type=int, default=0, help="questions, in corpus order (0 = all unseen; default 0)")
    p.add_argument("--width", type=int, default=9, help="samples per question (default %(default)s)")
    add_backend_args(p, max_tokens=384, parallel=9, n_ctx=2048)
    p.add_argument("--seed", type=int, default=0, help="engine seed (default %(default)s)")
    p.add_argument("--max-in-flight", type=int, default=1, help="questions at once (default %(default)s)")
    add_output_args(p, out_help="sample directory (created; continued if it exists)",
                    out="results/fresh-samples-gsm8k", path=True, verbose=True)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, backend: Backend | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    require_at_least(a, 0, "n")
    require_at_least(a, 1, "width", "max_tokens", "parallel", "n_ctx", "max_in_flight")
    corpus = load_corpus(a.corpus)
    task, split = corpus.settings.get("task", "gsm8k"), corpus.settings.get("split", "train")
    s = FreshSampleSettings(corpus=str(a.corpus), corpus_task=task, corpus_split=split, holdout=a.holdout,
                            split_seed=a.split_seed, llm=a.llm, width=a.width,
                            temperature=corpus.settings.get("temperature0", 0.7),
                            top_p=corpus.settings.get("top_p0", 0.9), max_tokens=a.max_tokens,
                            layout=corpus.settings.get("layout", "multiturn"), seed=a.seed)
    ids = unseen_question_ids(a.corpus, a.holdout, a.split_seed)
    ids = ids[:a.n] if a.n else ids
    questions = questions_of(ids, task, split)
    out = open_run_dir(Path(a.out), s, "use the stored settings to continue, or another --out")
    own = backend is None
    if own:
        kw = options_for(a.llm, {"n_parallel": a.parallel, "n_ctx": a.n_ctx})
        backend = make_backend(a.llm, **kw)
    try:
        collect(out, s, questions, backend, a.max_in_flight)
    finally:
        if own:
            backend.close()
        print(write_provenance(out, s, len(questions), command_line(PROG, argv)))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
