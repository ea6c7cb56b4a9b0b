"""`python -m eval.run`: a trained DEAR policy zero-shot vs the baselines, on the same questions, seeds and model.

    python -m eval.run --checkpoint runs/gsm8k --benchmarks math500,gpqa_diamond --n 100 --llm local

Results directory (``--out``; default ``runs/eval/eval-<benchmarks>-n<N>-s<seed>``, so that a trial run never
writes into the committed ``results/``): ``traces/<benchmark>/round0.jsonl`` (the round 0 of every question,
generated once and read by every method), ``traces/<benchmark>/<method>.jsonl`` (one DebateTrace per line; DEAR
methods also ``<method>.regulator.jsonl`` with the beliefs, masks and sampling the policy chose), ``summary.csv``,
``summary.md``, PNG plots, ``run.json`` (the settings, the llama.cpp thread count among them), ``done.tsv``
(finished benchmark/method/question), ``timings.json`` and ``cache.sqlite`` (the response cache).

Re-running the same command continues where it stopped: finished questions are skipped (done-list). A debate
that a backend error ended is never "done": its trace is kept for the record, the report lists it and leaves it
out of the accuracy, and the next run of the command retries it (a failed round 0 likewise). A directory keeps
the policy it was first evaluated with: later runs and ``--report-only`` without ``--checkpoint`` use the stored
one, runs of baselines only may extend it, and another policy needs another ``--out`` (``--cache`` can point at
the first directory's cache so the baselines replay instead of being generated again). A directory of baselines
only takes the policy of the first run that names one, so baselines may run first and DEAR later on their round 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dear import tasks
from dear.atomic import write_json
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate import DebateConfig, DebateEngine
from dear.debate.engine import Debate
from dear.debate.cli_args import (
    OMIT,
    add_backend_args,
    add_checkpoint_args,
    add_debate_args,
    add_output_args,
    add_question_args,
    n_agents_of,
)
from dear.debate.profiles import as_profiles, backend_specs, on_backend
from dear.debate.protocols import unanimous
from dear.debate.interventions import InterventionProtocol
from dear.debate.trace import DebateTrace, read_jsonl
from dear.export import choose_encoder
from dear.integrity import read_json
from dear.llm import registry
from dear.llm.base import GENERATED_TOKENS, Backend
from dear.progress import LiveProgress
from dear.regulator import CertaintyWeigher
from dear.tasks.types import Question
from eval import methods as M
from eval.action_frequencies import ActionFrequencies, action_frequencies
from eval import plots, report

log = logging.getLogger("eval")

# Settings that must not change inside one results directory (they change the questions or the answers).
# `--n` may change: a subset is the first n of a seeded shuffle, so a larger n extends a smaller one.
_FIXED_SETTINGS = ("llm", "seed", "n_agents", "n_rounds", "max_tokens", "temperature", "top_p", "sc_samples",
                   "checkpoint", "encoder", "backend_options", "checkpoint_sha256", "layout", "policy_sampling",
                   "agent_profiles")
# Fixed settings that came later: a run.json without one was written by a run that had this value.
_ADDED_SETTINGS = {"agent_profiles": None}
# The policy's settings: a run without a DEAR method keeps the directory's (its answers do not depend on them).
_POLICY_SETTINGS = ("checkpoint", "encoder", "checkpoint_sha256", "policy_sampling")
POLICY_SAMPLING = ("deterministic", "sampled")
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


def _range(text: str | None, flag: str) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} must be 'lo,hi' (two numbers), got {text!r}") from None
    return lo, hi


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_question_args(p, benchmarks=True, split=OMIT, n=100, n_note="per benchmark, a seeded subset; 0 = all")
    p.add_argument("--methods", default="all", help=M.methods_help())
    p.add_argument("--sc-samples", type=int, help="self-consistency samples (default V*(R+1): MAD's call budget)")
    p.add_argument("--batch", type=int, default=8, help="questions per engine batch (and per done-list flush)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples for CIs")
    backend = add_backend_args(p, speculative=True, agent_profiles=True, sim_world=True)
    backend.add_argument("--cache", help="response cache path (default OUT/cache.sqlite)")
    backend.add_argument("--no-cache", action="store_true", help="do not use a response cache")
    add_debate_args(p, n_agents=None, n_agents_note="default: the checkpoint's, else 3", n_rounds=None,
                    n_rounds_note="default: the checkpoint's, else 2", sampling=True,
                    sampling_note="round 0 and the methods with fixed sampling", layout=None,
                    layout_note="default: the engine's", seed_note="also the question subset and the bootstrap")
    policy = add_checkpoint_args(p, checkpoint_note="needed by DEAR methods; default: the one --out was "
                                                    "evaluated with")
    policy.add_argument("--temperature-range", help="expected temperature range lo,hi; error if the checkpoint "
                                                    "differs")
    policy.add_argument("--top-p-range", help="expected top-p range lo,hi; error if the checkpoint differs")
    policy.add_argument("--policy-sampling", choices=POLICY_SAMPLING, default="deterministic",
                        help="DEAR policies act by the mode of their distribution (default) or sample (seeded per "
                             "chunk)")
    policy.add_argument("--policy-world", help="override the DEAR label's training world (default: from the "
                                               "checkpoint, e.g. sim-trained, sim-fitted, local-trained)")
    add_output_args(p, out_help="results directory (default runs/eval/eval-<benchmarks>-n<N>-s<seed>; the committed "
                                "reports under results/ are written only when --out names them)",
                    report_only="rebuild summary and plots from existing traces")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    return p.parse_args(argv)


# ---------------------------------------------------------------- results directory bookkeeping
class ResultsDir:
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


def _append_lines(path: Path, lines: Sequence[str]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _check_settings(root: Path, settings: EvalSettings, report_only: bool = False) -> dict[str, Any]:
    """Refuse to mix runs with different settings in one results directory; returns the stored run.json.

    A run.json written before a setting was guarded lacks it: such a directory can be re-reported
    (``--report-only``) but not extended, since its round 0 was not stored for sharing."""
    path = root / "run.json"
    current = asdict(settings)
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); repair it or use another --out") from None
        old = {**_ADDED_SETTINGS, **stored.get("settings", {})}
        missing = [k for k in _FIXED_SETTINGS if k not in old]
        if missing and not report_only:
            raise ValueError(f"{path} predates the settings {missing} (an older eval.run wrote it, without a "
                             f"stored round 0); rebuild its report with --report-only or use a fresh --out")
        # The weights' sha256 names the policy: the same policy at another path (a checkout elsewhere, a copied
        # directory) resumes; the path counts only where run.json has no hash to compare.
        hashed = bool(old.get("checkpoint_sha256") and current["checkpoint_sha256"])
        compared = [k for k in _FIXED_SETTINGS
                    if k in old and not (k == "checkpoint" and (report_only or hashed))]
        # Baselines only (now, or so far): their answers do not depend on a policy, so a run without one keeps
        # the directory's, and a directory without one takes the first run's (baselines first, DEAR later).
        adopts = settings.checkpoint is not None and old.get("checkpoint") is None
        if settings.checkpoint is None or adopts:
            compared = [k for k in compared if k not in _POLICY_SETTINGS]
        diff = {k: (old.get(k), current[k]) for k in compared if old.get(k) != current[k]}
        if diff:
            raise ValueError(
                f"{root} holds an evaluation with different settings "
                + ", ".join(f"{k}: {a!r} there vs {b!r} now" for k, (a, b) in diff.items())
                + "; use another --out (or the original settings to resume)"
            )
        if adopts and not report_only:
            stored["settings"] = {**stored.get("settings", {}), **{k: current[k] for k in _POLICY_SETTINGS}}
        return stored
    return {"settings": current}


# ---------------------------------------------------------------- the runner
@dataclass
class Collected:
    """A results directory's report inputs: each method's results, the debates still failed per
    (benchmark, method), the model ids in the traces, and the benchmarks whose round 0 was not stored."""

    results: list[report.MethodResult]
    failures: dict[tuple[str, str], list[tuple[str, str]]]
    model_ids: set[str]
    legacy: list[str]


class Evaluator:
    def __init__(self, settings: EvalSettings, specs: list[M.MethodSpec], ckpt: M.Checkpoint | None,
                 backend: Backend | Mapping[str, Backend] | None = None):
        self.s = settings
        self.specs = specs
        self.ckpt = ckpt
        self.results = ResultsDir(Path(settings.out))
        # Built lazily: a finished run rebuilds its report without loading a model. A mapping (spec -> backend)
        # serves agent profiles on several backends.
        self._backend = backend if backend is None or isinstance(backend, Backend) else dict(backend)
        self._encoder = None
        self.model_id: str | None = None
        self.synthetic: bool | None = None
        if backend is not None:
            self._describe()
        self.profiles = as_profiles(settings.agent_profiles, "agent_profiles") if settings.agent_profiles else None
        self.base = DebateConfig(n_agents=settings.n_agents, n_rounds=settings.n_rounds,
                                 temperature0=settings.temperature, top_p0=settings.top_p,
                                 max_tokens=settings.max_tokens, seed=settings.seed, layout=settings.layout,
                                 agent_profiles=self.profiles)
        # Round 0 holds enough independent answers for every method: V, or the self-consistency samples.
        self._density: dict[str, list[float]] = {}  # benchmark -> the random mask's per-round pair probability
        self._frequencies: dict[str, ActionFrequencies] = {}  # benchmark -> an extended policy's random control
        self.round0_width = M.round0_width(settings.methods, settings.n_agents, settings.sc_samples)

    # -- lazily built heavy parts
    def backend(self) -> Backend | dict[str, Backend]:
        """The backend of every agent, or with agent profiles on several backends a mapping spec -> backend."""
        if self._backend is None:
            specs = backend_specs(self.profiles) if self.profiles else [self.s.llm]
            built = {spec: self._make_backend(spec) for spec in specs}
            self._backend = built[specs[0]] if len(built) == 1 else built
            self._describe()
            log.info("backend %s (model %s)%s", ", ".join(specs), self.model_id,
                     " [synthetic]" if self.synthetic else "")
        return self._backend

    def _make_backend(self, spec: str) -> Backend:
        from dear.llm.cache import CachedBackend
        from dear.llm.registry import make_backend

        options = options_for(spec, self.s.llm, self.s.backend_options)
        if self.s.llama_threads and registry.uses_llama_cpp(spec):
            options["n_threads"] = self.s.llama_threads
        inner = make_backend(spec, **options)
        cache = self.s.cache if self.s.cache is not None else str(Path(self.s.out) / "cache.sqlite")
        return CachedBackend(inner, cache) if cache else inner

    def _backends(self) -> list[Backend]:
        b = self._backend
        return [] if b is None else [b] if isinstance(b, Backend) else list(b.values())

    def _describe(self) -> None:
        backends = self._backends()
        self.model_id = ", ".join(dict.fromkeys(b.model_id for b in backends))
        self.synthetic = any(b.synthetic for b in backends)

    def encoder(self):
        if self._encoder is None:
            from dear.evidence import make_encoder

            self._encoder = make_encoder(self.s.encoder or self.ckpt.encoder)
        return self._encoder

    def close(self) -> None:
        for b in self._backends():
            b.close()

    # -- work
    def questions(self, benchmark: str) -> list[Question]:
        return tasks.load(benchmark, n=self.s.n or None, seed=self.s.seed)

    def run(self) -> None:
        """Chunk-major order (chunk k of every benchmark and method before chunk k+1), so an evaluation cut
        short still compares all methods on the same questions. Each chunk first completes its stored round 0,
        then runs every method from it. The density-matched random mask runs last, after DEAR's chunks."""
        plan: list[tuple[int, str, list[Question]]] = []
        todo: dict[tuple[str, str], set[str]] = {}
        for b in self.s.benchmarks:
            qs = self.questions(b)
            ids = [q.id for q in qs]
            if len(set(ids)) != len(ids):
                raise ValueError(f"benchmark {b}: duplicate question ids in the subset")
            for spec in self.specs:
                todo[(b, spec.name)] = set(ids) - self.results.finished(b, spec.name)
            for k in range((len(qs) + self.s.batch - 1) // self.s.batch):
                plan.append((k, b, qs[k * self.s.batch:(k + 1) * self.s.batch]))
        plan.sort(key=lambda item: item[0])  # stable: benchmarks keep their order within a chunk
        first = [s for s in self.specs if s.selection_mode != "random" or s.kind != "dear"]
        last = [s for s in self.specs if s not in first]
        total = sum(len(v) for v in todo.values())
        if total == 0:
            log.info("nothing to do: all questions of all methods are finished")
            return
        timings = self._timings()
        # Tokens and elapsed time move while a chunk's debates run; questions count when a method's chunk ends.
        with LiveProgress(total, "eval", unit="q", tokens=GENERATED_TOKENS.total, enabled=self.s.progress) as bar:
            for specs in (first, last):
                for k, b, chunk in plan:
                    work = {spec: [q for q in chunk if q.id in todo[(b, spec.name)]] for spec in specs}
                    need = [q for q in chunk if any(q in qs for qs in work.values())]
                    if not need:
                        continue
                    bar.set_description(f"{b}/{ROUND0}")
                    round0 = self._timed(timings, b, ROUND0, self._round0, b, need)
                    for spec, qs in work.items():
                        ready = [q for q in qs if q.id in round0]
                        if not ready:
                            continue
                        bar.set_description(f"{b}/{spec.name}")
                        traces, regulator = self._timed(timings, b, spec.name, self._run_chunk,
                                                        spec, b, ready, k, round0)
                        self.results.append(b, spec.name, traces, regulator)
                        bar.update(len(ready))
        self._save_timings(timings)

    def _timed(self, timings: dict[str, float], benchmark: str, name: str, fn, *args):
        """fn(*args), its wall time added to timings[benchmark/name] (saved at once: a stop loses nothing)."""
        t0 = time.perf_counter()
        out = fn(*args)
        key = f"{benchmark}/{name}"
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        self._save_timings(timings)
        return out

    def _round0(self, benchmark: str, questions: list[Question]) -> dict[str, DebateTrace]:
        """The stored round 0 of these questions, generating what is missing (or narrower than needed) once.
        A widened row keeps the stored answers and adds the new agents' answers."""
        stored = self.results.round0(benchmark)
        width = self.round0_width
        missing = [q for q in questions if q.id not in stored]
        narrow = [q for q in questions if q.id in stored and stored[q.id].n_agents < width]
        if missing or narrow:
            engine = DebateEngine(self.backend(), replace(self.base, n_agents=width, n_rounds=0))
            fresh = engine.start(missing, n_rounds=0, protocol=ROUND0) if missing else []
            # widen: keep the stored answers (methods already share them) and generate only the new agents
            wide = engine.widen_round0(narrow, [stored[q.id].rounds[0] for q in narrow], protocol=ROUND0) \
                if narrow else []
            rows = [d.trace for d in fresh + wide]
            self.results.append_round0(benchmark, rows)
            n_failed = sum(t.failed for t in rows)
            if n_failed:
                log.warning("%s: round 0 failed for %d of %d questions; the next run retries them",
                            benchmark, n_failed, len(rows))
            stored = self.results.round0(benchmark)
        # A row narrower than needed (its widening failed) waits for the retry, like a failed one.
        return {q.id: stored[q.id] for q in questions if q.id in stored and stored[q.id].n_agents >= width}

    def _run_chunk(self, spec: M.MethodSpec, benchmark: str, chunk: list[Question], chunk_index: int,
                   round0: dict[str, DebateTrace]):
        import numpy as np

        from dear.seeds import derive_seed

        random_control = spec.kind == "dear" and spec.selection_mode == "random"
        # an extended policy may stop before a round: its control matches frequencies, not one density over turns
        frequencies = self._dear_frequencies(benchmark) if random_control and self.ckpt.extended else None
        density = frequencies.density if frequencies else self._dear_density(benchmark) if random_control else None
        run = M.build(spec, self.base, self.s.sc_samples, self.ckpt,
                      self.encoder() if spec.needs_checkpoint else None,
                      seed=derive_seed(self.s.seed, chunk_index, 0xD0),  # random-mask draws: fixed per chunk
                      deterministic=self.s.policy_sampling == "deterministic", density=density,
                      frequencies=frequencies)
        if spec.needs_checkpoint and self.s.policy_sampling == "sampled":
            import torch

            torch.manual_seed(derive_seed(self.s.seed, chunk_index, 0xA5))  # sampled actions: fixed per chunk
        engine = DebateEngine(self.backend(), run.config, weigher=self._weigher(run.config))
        if spec.rule:  # adaptive self-consistency: each question reads its own prefix; nothing is generated
            debates = self._rule_debates(spec, run, chunk, round0)
        else:
            width = run.config.n_agents
            debates = engine.start_from_round0(chunk, [round0[q.id].rounds[0][:width] for q in chunk],
                                               n_rounds=run.protocol.n_rounds, protocol=spec.name)
        if isinstance(run.protocol, InterventionProtocol):  # judge / policy / regenerate / moderator
            run.protocol.drive(engine, debates)
        else:
            if spec.stop_when_unanimous:
                _stop_unanimous(debates)
            while active := [d for d in debates if not d.done]:
                engine.step(active, run.protocol.controls(active))
                if spec.stop_when_unanimous:
                    _stop_unanimous(active)
        n_failed = sum(d.failed for d in debates)
        if n_failed:
            log.warning("%s/%s: %d of %d debates failed; the next run retries them", benchmark, spec.name,
                        n_failed, len(debates))
        traces = [d.trace for d in debates]
        for t in traces:
            t.protocol = spec.name
        check_round0(benchmark, spec.name, traces, round0, self.results.round0_path(benchmark))
        regulator = getattr(run.protocol, "records", None) if spec.needs_checkpoint else None
        if frequencies is not None:
            log.info("%s/%s: random policy with DEAR's per-round action frequencies %s", benchmark, spec.name,
                     frequencies.to_json())
        elif density is not None:
            log.info("%s/%s: random mask with DEAR's per-round read density %s", benchmark, spec.name,
                     np.round(density, 3).tolist())
        return traces, regulator

    def _weigher(self, config: DebateConfig) -> CertaintyWeigher | None:
        """The belief-weighted vote's weights from the checkpoint's own evidence (None for the other rules)."""
        if config.decision != "belief-weighted":
            return None
        return CertaintyWeigher(self.encoder(), self.ckpt.answer_aware if self.ckpt else 0.0)

    def _rule_debates(self, spec: M.MethodSpec, run: M.MethodRun, chunk: list[Question],
                      round0: dict[str, DebateTrace]) -> list[Debate]:
        """The finished debates of an adaptive rule: each question's stored round 0 cut to the answers the rule
        reads (`M.rule_width`), voted by the engine like every method (one engine per width)."""
        widths = {q.id: M.rule_width(spec, round0[q.id].rounds[0], self.s.n_agents, self.s.sc_samples)
                  for q in chunk}
        debates: dict[str, Debate] = {}
        for width in sorted(set(widths.values())):
            group = [q for q in chunk if widths[q.id] == width]
            engine = DebateEngine(self.backend(), replace(run.config, n_agents=width))
            for d in engine.start_from_round0(group, [round0[q.id].rounds[0][:width] for q in group],
                                              n_rounds=0, protocol=spec.name):
                debates[d.question.id] = d
        return [debates[q.id] for q in chunk]

    def _dear_density(self, benchmark: str) -> list[float]:
        """DEAR's realized per-round read density on this benchmark (all its finished debates when the random
        mask first needs it in this run; kept for the run and recorded in run.json)."""
        if benchmark in self._density:
            return self._density[benchmark]
        from dear.metrics import summarize

        traces = self.results.load(benchmark, "dear", sorted(self.results.finished(benchmark, "dear")))
        if not traces:
            raise ValueError(f"dear-random-mask matches DEAR's per-round read density on {benchmark}, but DEAR has "
                             f"no finished debates there: add dear to --methods or run it first")
        density = summarize([report.trace_to_record(t) for t in traces], n_boot=1).read_density
        if len(density) < self.s.n_rounds or any(x != x for x in density[:self.s.n_rounds]):  # NaN: round not reached
            raise ValueError(f"DEAR's traces on {benchmark} do not cover {self.s.n_rounds} exchange rounds "
                             f"(read density {density})")
        self._density[benchmark] = density[:self.s.n_rounds]
        path = Path(self.s.out) / "run.json"
        run_json = read_json(path, "run settings") if path.exists() else {}
        run_json.setdefault("random_mask_density", {})[benchmark] = self._density[benchmark]
        write_json(path, run_json, indent=1)
        return self._density[benchmark]

    def _dear_frequencies(self, benchmark: str) -> ActionFrequencies:
        """DEAR's realized per-round stop, kind and reviser read frequencies on this benchmark (an extended-action
        policy's random control matches them; eval/action_frequencies.py), recorded in run.json."""
        if benchmark not in self._frequencies:
            traces = self.results.load(benchmark, "dear", sorted(self.results.finished(benchmark, "dear")))
            if not traces:
                raise ValueError(f"dear-random-mask matches DEAR's action frequencies on {benchmark}, but DEAR has "
                                 f"no finished debates there: add dear to --methods or run it first")
            self._frequencies[benchmark] = action_frequencies(traces, self.s.n_rounds)
            path = Path(self.s.out) / "run.json"
            run_json = read_json(path, "run settings") if path.exists() else {}
            run_json.setdefault("random_policy_frequencies", {})[benchmark] = self._frequencies[benchmark].to_json()
            write_json(path, run_json, indent=1)
        return self._frequencies[benchmark]

    def _timings(self) -> dict[str, float]:
        p = Path(self.s.out) / "timings.json"
        return read_json(p, "generation timings") if p.exists() else {}

    def _save_timings(self, timings: dict[str, float]) -> None:
        write_json(Path(self.s.out) / "timings.json", timings, indent=1)

    # -- report
    def label(self, spec: M.MethodSpec) -> str:
        """The report's label: DEAR methods carry the policy's training world, e.g. "DEAR (sim-trained)", and an
        extended policy's methods say so ("DEAR extended (sim-fitted)"), so a report that sets them beside the
        paper's DEAR on the same questions (`eval.combine`) tells the two apart; a policy that observes the agents'
        profiles says so too ("DEAR+profiles (sim-fitted)")."""
        if not spec.needs_checkpoint or self.ckpt is None:
            return spec.label
        name = spec.label
        if self.ckpt.extended:
            # its random control draws its stop and kinds too, not only a mask
            name = "DEAR extended random (action frequencies)" if spec.selection_mode == "random" \
                else name.replace("DEAR", "DEAR extended", 1)
        if self.ckpt.policy_config.profiles:
            name = name.replace("DEAR", "DEAR+profiles", 1)
        return f"{name} ({self.s.policy_world or self.ckpt.world})"

    def collect(self) -> Collected:
        """Every method's results over the questions every method finished, read from the traces; writes
        nothing. Raises when a method's round 0 differs from the stored one (the sharing every comparison
        relies on)."""
        results = []
        model_ids: set[str] = set()
        failures: dict[tuple[str, str], list[tuple[str, str]]] = {}
        legacy = []
        for b in self.s.benchmarks:
            ids = [q.id for q in self.questions(b)]
            loaded = {spec.name: self.results.load(b, spec.name, ids) for spec in self.specs}
            failures[(b, ROUND0)] = self.results.failures(b, ROUND0, ids)
            for spec in self.specs:
                failures[(b, spec.name)] = self.results.failures(b, spec.name, ids)
            if self.results.round0_path(b).exists():
                round0 = self.results.round0(b)
                for spec in self.specs:
                    check_round0(b, spec.name, loaded[spec.name], round0, self.results.round0_path(b))
            else:
                legacy.append(b)
            # Compare methods on the same questions: those every method with traces has finished.
            present = [ts for ts in loaded.values() if ts]
            common = set.intersection(*({t.question_id for t in ts} for ts in present)) if present else set()
            if len(common) < len(ids):
                log.warning("%s: reporting the %d of %d questions finished by every method", b, len(common), len(ids))
            for spec in self.specs:
                traces = [t for t in loaded[spec.name] if t.question_id in common]
                if not traces:
                    log.warning("no finished traces for %s/%s; left out of the report", b, spec.name)
                    continue
                model_ids.update(m for t in traces for m in t.model_ids)
                results.append(report.evaluate(b, spec.name, self.label(spec), traces, seed=self.s.seed,
                                               n_boot=self.s.n_boot))
        if not results:
            n_failed = sum(len(v) for v in failures.values())
            raise ValueError(f"{self.s.out}: no finished debates to report"
                             + (f" ({n_failed} failed on backend errors; run the same command again to retry them)"
                                if n_failed else ""))
        for (b, m), items in failures.items():
            if items:
                log.warning("%s/%s: %d failed debates remain (listed in summary.md; rerun the command to retry)",
                            b, m, len(items))
        return Collected(results, failures, model_ids, legacy)

    def report(self, command: str) -> list[report.MethodResult]:
        """Summary, CSV and plots of `collect`'s results, written into the results directory."""
        collected = self.collect()
        results, failures, model_ids = collected.results, collected.failures, collected.model_ids
        out = Path(self.s.out)
        run_json = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        synthetic = bool(self.synthetic if self.synthetic is not None else run_json.get("synthetic", False))
        synthetic = synthetic or any(registry.is_synthetic(m) for m in model_ids)
        report.write_csv(results, out / "summary.csv", failures=failures)
        timings = self._timings()
        generation = {b: sum(v for k, v in timings.items() if k.split("/", 1)[0] == b) for b in self.s.benchmarks}
        requested = {b: len(self.questions(b)) for b in self.s.benchmarks}
        reported = {b: max((r.summary.n for r in results if r.benchmark == b), default=0) for b in self.s.benchmarks}
        meta = {
            "title": "DEAR evaluation" + (" (SYNTHETIC)" if synthetic else ""),
            "synthetic": synthetic,
            "command": command,
            "model": ", ".join(sorted(model_ids)) + f" (`--llm {self.s.llm}`)",
            "checkpoint": self._checkpoint_note(),
            "policy_sampling": self._policy_note(),
            "seed": f"{self.s.seed} (question subset, sampling seeds, tie-breaks, bootstrap)",
            "n": ", ".join(f"{b}: {reported[b]}" + (f" of {requested[b]} requested" if reported[b] != requested[b]
                                                    else "") for b in self.s.benchmarks),
            "debate": (f"V={self.s.n_agents} agents, R={self.s.n_rounds} exchange rounds, round-0/fixed sampling "
                       f"T={self.s.temperature}, top-p={self.s.top_p}, max_tokens={self.s.max_tokens}, "
                       f"self-consistency samples={self.s.sc_samples}, exchange layout {self.s.layout}, "
                       f"{self.s.n_boot} bootstrap resamples"
                       + (f", agent profiles {', '.join(self.s.agent_profiles)} (a wider round 0 continues the "
                          f"pool in order)" if self.s.agent_profiles else "")),
            "agent_profiles": self.s.agent_profiles,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_time": f"{sum(timings.values()) / 60:.1f} min of generation over all runs of this directory"
                         if timings else "",
            "failures": failures,
            "labels": {ROUND0: "round 0 (shared)", **{spec.name: self.label(spec) for spec in self.specs}},
            "generation_s": generation if timings else {},
            "notes": [self._sharing_note(collected.legacy)] + [
                f"Random-mask control on {b}: each pair read with probability {', '.join(f'{p:.3f}' for p in d)} "
                f"in exchange rounds 1..{len(d)} (DEAR's realized read density there, drawn independently; the "
                f"realized densities are in the read-density table)"
                for b, d in run_json.get("random_mask_density", {}).items()
                if b in self.s.benchmarks and "dear-random-mask" in self.s.methods],
        }
        md = report.markdown(results, meta, seed=self.s.seed, n_boot=self.s.n_boot)
        regraded = report.read_regrade_record(out)
        if regraded is not None:
            md += "\n" + "\n".join(report.moved_note(regraded, {
                f"{r.benchmark}/{r.method}": (r.summary.accuracy.mean, r.summary.accuracy_seeded.mean)
                for r in results}, n_now={f"{r.benchmark}/{r.method}": r.summary.n for r in results}))
        (out / "summary.md").write_text(md, encoding="utf-8")
        plots.write_all(results, out, synthetic=synthetic)
        run_json["synthetic"] = synthetic
        write_json(out / "run.json", run_json, indent=1)
        return results

    def _sharing_note(self, legacy: list[str]) -> str:
        if legacy:
            return (f"Round 0 of {', '.join(legacy)} was not stored (an older eval.run wrote these traces): "
                    "methods shared it only through the response cache, which is not verified here; answers of "
                    "completions cut at the token limit were extracted by the older rule (last-number fallback).")
        adaptive = ("adaptive self-consistency = the first V, then one more at a time until enough agree (at most "
                    "n; charged only the answers it read), " if any(s.rule for s in self.specs) else "")
        return ("Shared work: round 0 was generated once per question (traces/<benchmark>/round0.jsonl) and every "
                "method starts from it — single CoT = agent 0, round-0 majority = the first V answers, "
                f"self-consistency = the first n, {adaptive}the debates continue the first V; every method's round-0 "
                "text was checked against the stored one. Every method is still charged the tokens of all its calls, "
                "round 0 included.")

    def _policy_note(self) -> str:
        if self.ckpt is None:
            return ""
        if self.s.policy_sampling == "deterministic":
            return "deterministic — the mode of the policy (pairs with p > 0.5, behavior mean)"
        return "sampled — pairs and behavior drawn from the policy (torch seeded per chunk by --seed)"

    def _checkpoint_note(self) -> str:
        if self.ckpt is None:
            return ""
        c = self.ckpt
        note = f"{c.path} (trained with {c.trained_on or 'unknown backend'}; encoder {self.s.encoder or c.encoder})"
        if c.policy_config.actions == "extended":
            note += " — extended action set: each agent's turn revise / keep / fresh sample, and a stop"
        if c.decision != "last-round":
            weighted = ", each weighted by its agent's certainty 1 − u in its round" \
                if c.decision == "belief-weighted" else ""
            note += (f"; its debates' final vote is `{c.decision}` (every sample the debate drew: round 0, fresh "
                     f"samples and revisions; a kept answer does not vote twice{weighted}), the rule it was trained "
                     "with")
        if c.synthetic and not (self.synthetic or False):
            note += " — **sim-to-real transfer**: the policy was trained on the synthetic sim backend"
        return note


def _stop_unanimous(debates: Sequence[Debate]) -> None:
    """End every running debate whose last round is unanimous (all agents gave the same parsed answer)."""
    for d in debates:
        if d.done or not unanimous(d.answer_keys):
            continue
        d.finished = True
        d.trace.set_vote(d.vote())
        d.trace.decision = "last-round"  # the rule that vote took (recorded: a re-grade never guesses it)


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


def _check_sim_answers(benchmarks: list[str], specs: list[str]) -> None:
    """The synthetic debaters answer only the synthetic task: refuse another benchmark before any round 0 fails."""
    real = [b for b in benchmarks if b != "synthetic"]
    if real and any(registry.is_synthetic(spec) for spec in specs):
        raise ValueError(f"--llm sim answers only --benchmarks synthetic, not {', '.join(real)}; use a model "
                         f"(e.g. --llm local) for real benchmarks")


def benchmarks_of(a: argparse.Namespace) -> list[str]:
    """--benchmarks checked (aliases resolved): first of all, before the checkpoint loads or is asked for."""
    benchmarks = [b.strip() for b in a.benchmarks.split(",") if b.strip()]
    if not benchmarks:
        raise ValueError("--benchmarks is empty")
    benchmarks = [tasks.TASK_ALIASES.get(b, b) for b in benchmarks]  # `gpqa` = `gpqa_diamond`, as the README says
    unknown = [b for b in benchmarks if b not in tasks.task_names()]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; {tasks.known_tasks_hint()}")
    return benchmarks


DEFAULT_OUT_ROOT = "runs/eval"  # results directories without --out: outside the committed results/


def default_out(benchmarks: Sequence[str], n: int, seed: int) -> str:
    """The results directory when --out names none: under runs/eval/, never inside the committed results/."""
    return f"{DEFAULT_OUT_ROOT}/eval-{'-'.join(benchmarks)}-n{n}-s{seed}"


def settings_from_args(a: argparse.Namespace, ckpt: M.Checkpoint | None,
                       specs: list[M.MethodSpec]) -> EvalSettings:
    benchmarks = benchmarks_of(a)
    if a.n < 0:
        raise ValueError(f"--n must be >= 0, got {a.n}")
    if a.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {a.batch}")
    if a.agent_profiles and "," in a.llm:  # before the profiles take --llm as their backend
        raise ValueError("--llm must be one spec with --agent-profiles (each profile names its backend; --llm is the "
                         "backend of those that do not)")
    profiles = on_backend(a.agent_profiles, a.llm) if a.agent_profiles else None
    n_agents = n_agents_of(profiles, a.n_agents) or (ckpt.policy_config.n_agents if ckpt else 3)
    n_rounds = a.n_rounds if a.n_rounds is not None else (ckpt.n_rounds if ckpt and ckpt.n_rounds is not None else 2)
    if ckpt is not None:
        M.check_compatible(ckpt, n_agents, _range(a.temperature_range, "--temperature-range"),
                           _range(a.top_p_range, "--top-p-range"))
    sc_samples = a.sc_samples or n_agents * (n_rounds + 1)
    M.check_adaptive(specs, n_agents, sc_samples)
    out = a.out or default_out(benchmarks, a.n, a.seed)
    opts: dict[str, Any] = {}
    if a.parallel:
        opts["n_parallel"] = a.parallel
    if a.n_ctx:
        opts["n_ctx"] = a.n_ctx
    if a.speculative:
        opts["speculative"] = a.speculative
    opts.update(_sim_world(a, backend_specs(profiles) if profiles else [x.strip() for x in a.llm.split(",")]))
    layout = a.layout or DebateConfig.layout
    return EvalSettings(
        benchmarks=benchmarks, methods=[s.name for s in specs], n=a.n, llm=a.llm, seed=a.seed, n_agents=n_agents,
        n_rounds=n_rounds, max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p,
        sc_samples=sc_samples, checkpoint=str(Path(a.checkpoint).resolve()) if ckpt else None,
        encoder=choose_encoder(ckpt.encoder, a.encoder, a.allow_encoder_mismatch) if ckpt else a.encoder,
        out=out, batch=a.batch,
        cache="" if a.no_cache else a.cache, n_boot=a.n_boot, progress=not a.no_progress, backend_options=opts,
        checkpoint_sha256=ckpt.sha256 if ckpt else None, layout=layout, policy_sampling=a.policy_sampling,
        policy_world=a.policy_world, agent_profiles=[p.name for p in profiles] if profiles else None,
    )


SIM_OPTIONS = ("params_file", "text_bank")  # --sim-params, --sim-text-bank: the sim backend's world


def llama_threads_for(specs: Sequence[str], stored: int | None) -> tuple[int | None, str | None]:
    """The llama.cpp thread count of a run on backends `specs` and the line to log about it: None without a
    local/smoke backend; else the count the directory's run.json recorded (`stored`), unless DEAR_LLAMA_THREADS
    asks for another (said in the line: a seed's texts depend on the count), else `choose_threads()`'s fixed
    default (DEAR_LLAMA_THREADS, else every usable core; never the machine's load)."""
    if not any(registry.uses_llama_cpp(spec) for spec in specs):
        return None, None
    env = (os.environ.get("DEAR_LLAMA_THREADS") or "").strip()
    if stored and (not env or env == str(stored)):
        return int(stored), (f"llama.cpp threads: {stored}, as recorded in this directory's run.json (the texts of "
                             f"a seed depend on the count)")
    from dear.llm.local import choose_threads

    threads = choose_threads().threads
    if stored:
        return threads, (f"llama.cpp threads: {threads} (DEAR_LLAMA_THREADS={env}), not the {stored} recorded in "
                         f"this directory's run.json: questions generated now may read differently from the same "
                         f"seed's earlier ones")
    return threads, f"llama.cpp threads: {threads}, recorded in run.json (later runs of this directory reuse it)"


def _stored_setting(out: str, key: str) -> Any:
    """One setting of an existing results directory's run.json (None: no such directory, file or key)."""
    path = Path(out) / "run.json"
    try:
        return json.loads(path.read_text()).get("settings", {}).get(key) if path.exists() else None
    except (json.JSONDecodeError, AttributeError):
        return None  # _check_settings names the broken file


def options_for(spec: str, llm: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The backend options one backend of the run takes: the world's files only the sim backend; --parallel,
    --n-ctx, --speculative (llama.cpp settings) the run's --llm backend (one it cannot take fails there, not
    silently) and any other backend that takes them (dear.llm.registry.options_for: a llama.cpp one)."""
    if spec == llm and not registry.is_synthetic(spec):
        return {k: v for k, v in options.items() if k not in SIM_OPTIONS}
    return registry.options_for(spec, options)


def _sim_world(a: argparse.Namespace, specs: Sequence[str]) -> dict[str, str]:
    """--sim-params / --sim-text-bank as backend options, checked: existing files, and a sim backend to take them."""
    given = {"params_file": (a.sim_params, "--sim-params"), "text_bank": (a.sim_text_bank, "--sim-text-bank")}
    opts = {}
    for key, (value, flag) in given.items():
        if value is None:
            continue
        if not any(registry.is_synthetic(s) for s in specs):
            raise ValueError(f"{flag} sets the sim backend's world, but no agent runs on --llm sim")
        if not Path(value).is_file():
            raise ValueError(f"{flag}: no such file {value}")
        opts[key] = str(value)
    return opts


def _directory_checkpoint(out: str | None) -> str | None:
    """The policy an existing results directory was evaluated with (its run.json), if it still exists."""
    path = Path(out) / "run.json" if out else None
    if path is None or not path.exists():
        return None
    try:
        stored = json.loads(path.read_text()).get("settings", {}).get("checkpoint")
    except (json.JSONDecodeError, AttributeError):
        return None  # _check_settings names the broken file
    if stored and not Path(stored).exists():
        log.warning("%s names the policy %s, which is gone", path, stored)
        return None
    return stored


def _policy_of(a: argparse.Namespace, specs: list[M.MethodSpec]) -> M.Checkpoint | None:
    """The checkpoint the DEAR methods run (or that names the directory's DEAR rows); None without one."""
    if not a.checkpoint:  # a directory evaluated with a policy keeps it: resuming needs no --checkpoint
        a.checkpoint = _directory_checkpoint(a.out or default_out(benchmarks_of(a), a.n, a.seed))
    if any(s.needs_checkpoint for s in specs) and not a.checkpoint:
        need = [s.name for s in specs if s.needs_checkpoint]
        raise ValueError(f"methods {need} need --checkpoint (a training run dir or an exported policy)")
    return M.load_checkpoint(a.checkpoint) if a.checkpoint else None


def read_results(argv: Sequence[str]) -> list[report.MethodResult]:
    """The results of the `eval.run` directory that these arguments name, read from its traces without writing
    anything there (eval.combine reads directories another run may still be writing)."""
    a = parse_args(list(argv))
    specs = M.parse_methods(a.methods)
    benchmarks_of(a)  # a wrong benchmark is named before anything about the checkpoint
    ckpt = _policy_of(a, specs)
    settings = settings_from_args(a, ckpt, specs)
    _check_settings(Path(settings.out), settings, report_only=True)
    ev = Evaluator(settings, specs, ckpt)
    try:
        return ev.collect().results
    finally:
        ev.close()


def main(argv: Sequence[str] | None = None,
         backend: Backend | Mapping[str, Backend] | None = None) -> list[report.MethodResult]:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per loopback request is noise
    a = parse_args(argv)
    specs = M.parse_methods(a.methods)
    benchmarks_of(a)  # a wrong benchmark is named before anything about the checkpoint
    ckpt = _policy_of(a, specs)
    settings = settings_from_args(a, ckpt, specs)
    if backend is None and not a.report_only:  # the specs' backends will answer (a test may pass its own)
        _check_sim_answers(settings.benchmarks, backend_specs(as_profiles(settings.agent_profiles, "agent_profiles"))
                           if settings.agent_profiles else [x.strip() for x in settings.llm.split(",")])
    if not a.report_only:
        specs_used = (backend_specs(as_profiles(settings.agent_profiles, "agent_profiles"))
                      if settings.agent_profiles else [x.strip() for x in settings.llm.split(",")])
        settings.llama_threads, note = llama_threads_for(specs_used, _stored_setting(settings.out, "llama_threads"))
        if note:
            log.info("%s", note)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    stored = _check_settings(out, settings, report_only=a.report_only)
    recorded = stored.setdefault("settings", {})
    if settings.llama_threads is not None and recorded.get("llama_threads") is None:
        recorded["llama_threads"] = settings.llama_threads  # also in a directory from before the count was recorded
    # each method's vote rule (its traces record it too; eval.regrade never guesses an older trace's)
    stored.setdefault("vote_rules", {}).update({s.name: M.vote_rule(s, ckpt) for s in specs})
    write_json(out / "run.json", stored, indent=1)
    command = command_line("python -m eval.run", argv)
    if not a.report_only:  # the report names the command that produced the traces, not a re-render
        stored.setdefault("commands", []).append(command)
        write_json(out / "run.json", stored, indent=1)
    ev = Evaluator(settings, specs, ckpt, backend=backend)
    try:
        if not a.report_only:
            ev.run()
        results = ev.report(stored.get("commands", [command])[-1])
    finally:
        ev.close()
    md = (out / "summary.md").read_text(encoding="utf-8")
    start = md.find("## Accuracy and cost")
    end = md.find("\n## ", start + 1)
    print(md[start:end if end > 0 else None].strip())
    print(f"results in {out}")
    return results


if __name__ == "__main__":
    run_cli(main, "python -m eval.run", codes={Round0Mismatch: 1})  # a changed round 0 is a failed check
