"""`python -m eval.score_confidence`: confidence for samples stored before log-probabilities were kept, by teacher
forcing the stored texts with the model that wrote them (`Backend.score`: llama.cpp decodes each stored reply's
tokens under a grammar that allows only them and reports their log-probabilities).

    python -m eval.score_confidence score results/corpus-gsm8k results/fresh-samples-gsm8k --llm local
    python -m eval.score_confidence check --shelf gsm8k-train-cot-t0.7-p0.9-m384 --questions 6 --llm local \\
        --out results/confidence-scoring-check

`score` gives each round-0 turn (`--rounds all`: every turn) of a trace file's records that has no confidence its
record (dear/confidence.py), marked `scored_by`, and rewrites the file. A file is a debate corpus
(`corpus.jsonl.gz`) or a fresh-samples file (`samples.jsonl.gz`): gzip members of JSON records, each with a full
`trace`; a directory names the one it holds. Resumable: finished records go to `<file>.scoring` as they finish
(Ctrl-C keeps them, a kill loses at most the record being written; the same command continues), and the file is replaced once every record is there. A turn the
model cannot reproduce keeps `{"missing": "scoring failed: ..."}`, never a number. What ran is appended to
`confidence_scoring.json` beside the file. A trace written by another model is refused.

Scoring decodes one request at a time (`--parallel 1`): as fast here as 9 slots, exact, and on the embedded model 9
slots decoding grammar-forced replies together returned one token of 48 samples 12.4 nats off
(results/confidence-scoring-check/README.md).

`check` measures how far scored records are from live ones: it scores the stored texts of a bank shelf's first
`--questions` questions (live samples whose records were taken while sampling) and reports, per summary, the
largest and mean absolute difference, and how many samples the tokenizer splits as the model sampled them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from dear import tasks
from dear.atomic import atomic_write_text, write_json
from dear.bank.backend import DEFAULT_BANK
from dear.bank.store import Bank, BankSample
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.confidence import SUMMARIES, TOP_LOGPROBS, TokenArrays, confidence_dict, record_of
from dear.debate.cli_args import OMIT, add_backend_args
from dear.debate.corpus_file import gzip_members
from dear.debate.prompts import SYSTEM_PROMPT, round0_messages
from dear.llm.base import Backend, ChatMessage, ChatRequest
from dear.llm.registry import options_for

PROG = "python -m eval.score_confidence"
TRACE_FILES = ("corpus.jsonl.gz", "samples.jsonl.gz")
RECORD_FILE = "confidence_scoring.json"
log = logging.getLogger("eval.score_confidence")


# ---------------------------------------------------------------- score: trace files
def trace_file(path: Path) -> Path:
    """`path` itself, or the one trace file (`TRACE_FILES`) of a directory; ValueError naming what is missing."""
    if path.is_file():
        return path
    found = [path / name for name in TRACE_FILES if (path / name).is_file()]
    if len(found) != 1:
        raise ValueError(f"{path}: expected one of {', '.join(TRACE_FILES)} in it, found {len(found)}")
    return found[0]


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every JSON record of a gzip-members file, in order; ValueError naming the file and line of a bad one."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not JSON ({exc})") from None
            if not isinstance(record, dict) or not isinstance(record.get("trace"), dict):
                raise ValueError(f"{path}:{line_no}: a record without a `trace`")
            yield record


def append_record(path: Path, record: dict[str, Any]) -> None:
    """One gzip member holding the record, appended and flushed to disk (a cut write loses only this record)."""
    with open(path, "ab") as f:
        f.write(gzip.compress((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")))
        f.flush()
        os.fsync(f.fileno())


def resume(partial: Path) -> list[dict[str, Any]]:
    """The records a cut run finished (none when it never started); a last gzip member cut by a kill is moved aside
    (`<file>.cut-<time>`), so its record is scored again."""
    if not partial.exists():
        return []
    data = partial.read_bytes()
    members, end = gzip_members(data)
    if end < len(data):
        tail = partial.with_name(f"{partial.name}.cut-{int(time.time())}")
        tail.write_bytes(data[end:])
        with partial.open("r+b") as f:
            f.truncate(end)
        log.warning("%s: %d trailing byte(s) were no complete record (a killed run); moved to %s", partial,
                    len(data) - end, tail)
    return [json.loads(line) for body in members for line in body.decode("utf-8").splitlines() if line.strip()]


def record_id(record: dict[str, Any]) -> str:
    return str(record["trace"]["debate_id"])


def needs_score(turn: dict[str, Any], rounds: str) -> bool:
    """A turn to score: of the rounds asked for, with a text, no error, and no confidence yet (none or missing)."""
    if rounds != "all" and int(turn.get("round", 0)) != 0:
        return False
    stored = turn.get("confidence")
    return bool(turn.get("text")) and turn.get("error") is None and (stored is None or "missing" in stored)


def score_request(turn: dict[str, Any], session: str, k: int) -> ChatRequest:
    messages = tuple(ChatMessage(m["role"], m["content"]) for m in turn["messages"])
    return ChatRequest(messages=messages, session=session, logprobs=k)


def check_model(record: dict[str, Any], backend: Backend, where: str) -> None:
    """ValueError unless every model of the trace is the backend's: another model's probabilities of a text are not
    the confidence of the model that wrote it."""
    others = sorted({m for m in record["trace"].get("model_ids") or () if m != backend.model_id})
    if others:
        raise ValueError(f"{where}: debate {record_id(record)} was written by {', '.join(others)}, not by "
                         f"{backend.model_id}; score it with that model")


@dataclass
class ScoreTally:
    records: int = 0
    turns: int = 0
    failed: int = 0
    tokens: int = 0


def score_batch(backend: Backend, records: Sequence[dict[str, Any]], rounds: str, k: int, note: str,
                tally: ScoreTally) -> None:
    """Score the turns of `records` that need it, in one backend call (the slots decode them together)."""
    turns = [(r, t) for r in records for rnd in r["trace"]["rounds"] for t in rnd if needs_score(t, rounds)]
    requests = [score_request(t, f"{record_id(r)}/agent{t['agent']}", k) for r, t in turns]
    for (_, turn), c in zip(turns, backend.score(requests, [t["text"] for _, t in turns])):
        if not c.ok:
            turn["confidence"] = {"missing": f"scoring failed: {c.error}"}
            tally.failed += 1
            continue
        answer = turn.get("answer") if turn.get("program") is None else None
        turn["confidence"] = confidence_dict(c.logprobs, turn["text"], answer, "scoring: no log-probabilities sent",
                                             scored_by=note)
        tally.turns += 1
        tally.tokens += c.completion_tokens


def score_file(path: Path, backend: Backend, rounds: str = "0", k: int = TOP_LOGPROBS, batch_turns: int = 18,
               command: str = "") -> ScoreTally:
    """Score one trace file (module docstring); returns what this run added."""
    partial = path.with_name(path.name + ".scoring")
    done = {record_id(r) for r in resume(partial)}
    records = list(read_records(path))
    for r in records:
        check_model(r, backend, str(path))
    todo = [r for r in records if record_id(r) not in done]
    note = f"teacher forcing, {backend.model_id}, {datetime.now(timezone.utc):%Y-%m-%d}"
    tally, started = ScoreTally(), time.perf_counter()
    log.info("%s: %d records, %d already scored", path, len(records), len(done))
    batch: list[dict[str, Any]] = []
    for i, record in enumerate(todo):
        batch.append(record)
        pending = sum(needs_score(t, rounds) for r in batch for rnd in r["trace"]["rounds"] for t in rnd)
        if pending >= batch_turns or i == len(todo) - 1:
            score_batch(backend, batch, rounds, k, note, tally)
            for r in batch:
                append_record(partial, r)
            tally.records += len(batch)
            log.info("%s: %d/%d records (%d turns, %.0f s)", path.name, len(done) + tally.records, len(records),
                     tally.turns, time.perf_counter() - started)
            batch = []
    scored = [record_id(r) for r in read_records(partial)] if partial.exists() else []
    if sorted(scored) != sorted(record_id(r) for r in records):
        raise RuntimeError(f"{partial}: holds {len(scored)} records, {path} {len(records)}; not replaced")
    os.replace(partial, path)
    _append_run(path.parent / RECORD_FILE, {
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "command": command, "file": path.name,
        "model": backend.model_id, "rounds": rounds, "top_logprobs": k, "records": len(records),
        "turns_scored": tally.turns, "turns_failed": tally.failed, "tokens_forced": tally.tokens,
        "seconds": round(time.perf_counter() - started)})
    return tally


def _append_run(path: Path, run: dict[str, Any]) -> None:
    runs = json.loads(path.read_text(encoding="utf-8"))["runs"] if path.exists() else []
    write_json(path, {"runs": [*runs, run]})


# ---------------------------------------------------------------- check: scored against live records
@dataclass(frozen=True)
class SampleCheck:
    """One bank sample's live record against its scored one."""

    question_id: str
    sample: int
    same_split: bool  # the tokenizer splits the text into the tokens the model sampled (same token byte lengths)
    same_prompt: bool  # the forced request's prompt tokens equal the stored sample's
    diffs: dict[str, float | None]  # summary -> |scored - live| (None when either is None)
    token_max_diff: float | None  # largest per-token |log-probability| difference (same split only)
    error: str | None = None


def check_samples(backend: Backend, samples: Sequence[BankSample], questions: dict[str, tasks.Question],
                  style: str, k: int = TOP_LOGPROBS) -> list[SampleCheck]:
    """Score each live sample's stored text with its round-0 request and compare with its stored record."""
    requests = [ChatRequest(tuple(round0_messages(questions[s.question_id], SYSTEM_PROMPT, style)),
                            session=f"{s.question_id}/agent{s.sample}", logprobs=k) for s in samples]
    out = []
    for s, c in zip(samples, backend.score(requests, [s.text for s in samples])):
        if not c.ok:
            out.append(SampleCheck(s.question_id, s.sample, False, False, {}, None, error=c.error))
            continue
        answer = s.answer if s.program is None else None
        scored = confidence_dict(c.logprobs, s.text, answer, "none sent")
        live_arrays = TokenArrays.decode(s.confidence["per_token"])
        scored_arrays = TokenArrays.decode(scored["per_token"])
        same = np.array_equal(live_arrays.nbytes, scored_arrays.nbytes)
        live, new = record_of(s.confidence), record_of(scored)
        diffs = {m: (None if live.value(m) is None or new.value(m) is None else abs(new.value(m) - live.value(m)))
                 for m in SUMMARIES}
        token = float(np.max(np.abs(live_arrays.logprob.astype(float) - scored_arrays.logprob.astype(float)))) \
            if same else None
        out.append(SampleCheck(s.question_id, s.sample, bool(same), c.prompt_tokens == s.prompt_tokens, diffs, token))
    return out


def check_report(checks: Sequence[SampleCheck], shelf: str, command: str) -> str:
    ok = [c for c in checks if c.error is None]
    lines = [f"# Scored against live confidence records (shelf `{shelf}`)", "",
             f"Command: `{command}`", "",
             f"- Samples: {len(checks)} live bank samples (records taken while sampling, 9 slots decoding together); "
             f"scored by teacher forcing: {len(ok)}, failed: {len(checks) - len(ok)}.",
             f"- Tokenizer split = sampled split: {sum(c.same_split for c in ok)} of {len(ok)}; "
             f"prompt tokens equal: {sum(c.same_prompt for c in ok)} of {len(ok)}.",
             "", "| summary | samples | largest difference | mean difference |", "|---|---|---|---|"]
    for m in SUMMARIES:
        values = [c.diffs[m] for c in ok if c.diffs.get(m) is not None]
        if values:
            lines.append(f"| {m} | {len(values)} | {max(values):.4f} | {np.mean(values):.4f} |")
    tokens = [c.token_max_diff for c in ok if c.token_max_diff is not None]
    if tokens:
        lines += ["", f"Per token (samples split alike): the largest |log-probability difference| is "
                  f"{max(tokens):.4f}; its median over samples {np.median(tokens):.4f}."]
    return "\n".join(lines) + "\n"


def run_check(a: argparse.Namespace, backend: Backend, command: str) -> str:
    bank = Bank.open(a.bank)
    key = next((k for k in bank.keys if k.name == a.shelf), None)
    if key is None:
        raise ValueError(f"--shelf {a.shelf}: not in {bank.root} (shelves: {', '.join(k.name for k in bank.keys)})")
    shelf = bank.shelf(key)
    picked = shelf.questions[: a.questions]
    samples = [s for q in picked for s in shelf.of(q) if record_of(s.confidence) is not None]
    questions = {q.id: q for q in tasks.load(key.benchmark, split=key.split)}
    checks = check_samples(backend, samples, questions, key.profile, a.top_logprobs)
    report = check_report(checks, key.name, command)
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "summary.md", report)
    write_json(a.out / "checks.json", {"command": command, "shelf": key.name,
                                       "checks": [c.__dict__ for c in checks]})
    return report


# ---------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("score", help="give stored turns confidence by teacher forcing (resumable)")
    s.add_argument("paths", nargs="+", type=Path, help="trace files or directories holding one")
    s.add_argument("--rounds", choices=("0", "all"), default="0", help="turns to score (default: round 0)")
    c = sub.add_parser("check", help="scored records against a bank shelf's live ones")
    c.add_argument("--bank", type=Path, default=Path(DEFAULT_BANK), help="bank directory (default %(default)s)")
    c.add_argument("--shelf", required=True, help="shelf name (python -m dear.bank show)")
    c.add_argument("--questions", type=int, default=6, help="the shelf's first questions (default %(default)s)")
    c.add_argument("--out", type=Path, required=True, help="report directory")
    for q in (s, c):
        q.add_argument("--top-logprobs", type=int, default=TOP_LOGPROBS, help="alternatives per token (default "
                       "%(default)s, what live records keep)")
        add_backend_args(q, max_tokens=OMIT, parallel=1, n_ctx=4096,
                         parallel_note="1: one request at a time (exact; as fast as 9 here, which corrupted a token)")
        q.add_argument("-v", "--verbose", action="store_true", help="log each batch")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    require_at_least(a, 1, "parallel", "n_ctx", "top_logprobs")
    files = [trace_file(p) for p in a.paths] if a.command == "score" else []
    from dear.llm.registry import make_backend

    command = command_line(PROG, argv)
    backend = make_backend(a.llm, **options_for(a.llm, {"n_parallel": a.parallel, "n_ctx": a.n_ctx}))
    try:
        if a.command == "check":
            require_at_least(a, 1, "questions")
            print(run_check(a, backend, command))
            return 0
        for path in files:
            t = score_file(path, backend, a.rounds, a.top_logprobs, 2 * a.parallel, command)
            print(f"{path}: {t.records} records, {t.turns} turns scored, {t.failed} failed, {t.tokens} tokens")
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
