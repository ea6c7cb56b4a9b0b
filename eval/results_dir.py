"""An `eval.run` results directory: the run's settings (`EvalSettings`, kept in run.json), its files
(`ResultsDir`: traces, the stored round 0, the done-list, timings) and the check that every method shares the stored
round 0."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dear.atomic import write_json
from dear.debate import DebateConfig
from dear.debate.trace import DebateTrace, read_jsonl
from dear.integrity import read_json

ROUND0 = "round0"  # the pseudo-method name of the shared round 0 in timings and failure lists


@dataclass
class EvalSettings:
    benchmarks: list[str]
    methods: list[str]
    n: int | None
    llm: str
    seed: int
    n_agents: int
    n_rounds: int
    max_tokens: int
    temperature: float
    top_p: float
    sc_samples: int
    checkpoint: str | None
    encoder: str | None
    out: str
    batch: int = 8
    cache: str | None = None  # None = OUT/cache.sqlite; "" = no cache
    n_boot: int = 2000
    progress: bool = True
    backend_options: dict[str, Any] = field(default_factory=dict)
    checkpoint_sha256: str | None = None
    layout: str = DebateConfig.layout  # exchange-prompt layout
    policy_sampling: str = "deterministic"  # DEAR policies: mode of the action distribution, or sampled
    policy_world: str | None = None  # the DEAR policy's training world, shown in its labels
    # One profile per agent in the compact form with its backend filled in (dear/debate/profiles.py); None = the
    # paper's agents, all on --llm.
    agent_profiles: list[str] | None = None
    # llama.cpp threads of the local/smoke backends (None: no such backend). The texts of a seed depend on the count:
    # fixed at the directory's first run (DEAR_LLAMA_THREADS, else every usable core), recorded here and reused by
    # later runs of the directory (`llama_threads_for`).
    llama_threads: int | None = None
    # The model's own confidence: every call asks for its tokens' log-probabilities with this many alternatives
    # (None: not asked); on when a method reads confidences (cisc-3, confident-stop) or the policy observes them.
    logprobs: int | None = None
    # The confidence rules' fitted parameters (sampling_rules.FittedParams), when such a rule runs
    rule_params: str | None = None


class ResultsDir:
    """A results directory's files: traces per benchmark and method, the stored round 0, the done-list and the
    generation timings."""

    def __init__(self, root: Path):
        self.root = root
        self.done_path = root / "done.tsv"

    def trace_path(self, benchmark: str, method: str) -> Path:
        return self.root / "traces" / benchmark / f"{method}.jsonl"

    def regulator_path(self, benchmark: str, method: str) -> Path:
        return self.root / "traces" / benchmark / f"{method}.regulator.jsonl"

    def round0_path(self, benchmark: str) -> Path:
        return self.trace_path(benchmark, ROUND0)

    def done(self) -> set[tuple[str, str, str]]:
        if not self.done_path.exists():
            return set()
        out = set()
        for lineno, line in enumerate(self.done_path.read_text(encoding="utf-8").splitlines(), 1):
            parts = line.split("\t")
            if len(parts) != 3:
                raise ValueError(f"{self.done_path}:{lineno}: expected benchmark<TAB>method<TAB>question_id")
            out.add((parts[0], parts[1], parts[2]))
        return out

    def append(self, benchmark: str, method: str, traces: Sequence[DebateTrace],
               regulator: dict[str, list] | None = None) -> None:
        """Traces first (fsynced), then the done-list: a crash between the two only redoes the batch.
        Failed traces are kept for the record but never marked done, so the next run retries them."""
        path = self.trace_path(benchmark, method)
        path.parent.mkdir(parents=True, exist_ok=True)
        _append_lines(path, [t.to_json() for t in traces])
        if regulator is not None:
            from dear.regulator import decisions_json  # torch-heavy: only DEAR methods need it

            _append_lines(self.regulator_path(benchmark, method), [
                decisions_json(t.debate_id, t.question_id, regulator.get(t.debate_id, [])) for t in traces])
        _append_lines(self.done_path, [f"{benchmark}\t{method}\t{t.question_id}" for t in traces if not t.failed])

    def _latest(self, benchmark: str, method: str) -> dict[str, DebateTrace]:
        path = self.trace_path(benchmark, method)
        return {t.question_id: t for t in read_jsonl(path)} if path.exists() else {}

    def finished(self, benchmark: str, method: str) -> set[str]:
        """Questions whose latest trace is done and did not fail (a legacy done-list could mark failures)."""
        done = {q for b, m, q in self.done() if b == benchmark and m == method}
        return {q for q, t in self._latest(benchmark, method).items() if q in done and not t.failed}

    def load(self, benchmark: str, method: str, question_ids: Sequence[str]) -> list[DebateTrace]:
        """Finished traces of the given questions in question order (last write wins)."""
        latest = self._latest(benchmark, method)
        done = {q for b, m, q in self.done() if b == benchmark and m == method}
        return [latest[q] for q in question_ids if q in latest and q in done]

    def failures(self, benchmark: str, method: str, question_ids: Sequence[str]) -> list[tuple[str, str]]:
        """(question id, error) of the given questions whose latest attempt failed and that are not finished."""
        latest = self._latest(benchmark, method)
        finished = self.finished(benchmark, method) if method != ROUND0 else set()
        return [(q, latest[q].error or "failed") for q in question_ids
                if q in latest and latest[q].failed and q not in finished]

    def round0(self, benchmark: str) -> dict[str, DebateTrace]:
        """The stored round 0 per question (latest row that did not fail)."""
        path = self.round0_path(benchmark)
        return {t.question_id: t for t in read_jsonl(path) if not t.failed} if path.exists() else {}

    def append_round0(self, benchmark: str, traces: Sequence[DebateTrace]) -> None:
        path = self.round0_path(benchmark)
        path.parent.mkdir(parents=True, exist_ok=True)
        _append_lines(path, [t.to_json() for t in traces])

    def timings(self) -> dict[str, float]:
        """Generation wall time per "benchmark/method" over all runs of the directory (timings.json)."""
        p = self.root / "timings.json"
        return read_json(p, "generation timings") if p.exists() else {}

    def save_timings(self, timings: dict[str, float]) -> None:
        write_json(self.root / "timings.json", timings, indent=1)


def _append_lines(path: Path, lines: Sequence[str]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class Round0Mismatch(RuntimeError):
    """A method's round 0 is not the stored one: the methods' comparison would not be paired."""


def check_round0(benchmark: str, method: str, traces: Sequence[DebateTrace], round0: dict[str, DebateTrace],
                 path: Path) -> None:
    """Raise when a trace's round-0 text differs from the stored round 0 of its question (or it has none)."""
    for t in traces:
        stored = round0.get(t.question_id)
        if stored is None:
            raise Round0Mismatch(f"{benchmark}/{method}: question {t.question_id} has no stored round 0 in {path}")
        for turn in t.rounds[0] if t.rounds else []:
            ref = stored.rounds[0][turn.agent] if turn.agent < stored.n_agents else None
            if ref is None or ref.text != turn.text:
                raise Round0Mismatch(f"{benchmark}/{method}: question {t.question_id}, agent {turn.agent}: round-0 "
                                   f"text differs from the stored round 0 in {path}; methods must share round 0")
