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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dear import tasks
from dear.atomic import write_json
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate import DebateConfig, DebateEngine
from dear.debate.cli_args import (
    OMIT,
    add_backend_args,
    add_checkpoint_args,
    add_debate_args,
    add_output_args,
    add_question_args,
    n_agents_of,
    repeatable_of,
)
from dear.confidence import TOP_LOGPROBS
from dear.debate.profiles import as_profiles, backend_specs, on_backend
from dear.debate.sampling_rules import DEFAULT_RULE_PARAMS, FittedParams
from dear.debate.trace import DebateTrace
from dear.export import choose_encoder
from dear.llm import registry
from dear.llm.base import GENERATED_TOKENS, REPLAYED_TOKENS, Backend
from dear.progress import LiveProgress
from dear.tasks.types import Question
from eval import methods as M
from eval import report
from eval.chunk_runner import ChunkRunner
from eval.results_dir import ROUND0, EvalSettings, ResultsDir, Round0Mismatch, check_round0  # noqa: F401 (API)
from eval.run_report import Collected, Reporter

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
    p.add_argument("--rule-params", default=None, metavar="FILE",
                   help="the confidence rules' (cisc-3, confident-stop) parameters fitted on training questions "
                        "(default: the committed GSM8K-train fit, configs/rule-params-gsm8k-train.json)")
    p.add_argument("--batch", type=int, default=8, help="questions per engine batch (and per done-list flush)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples for CIs")
    backend = add_backend_args(p, speculative=True, agent_profiles=True, sim_world=True, repeatable=False,
                               repeatable_note="off by default: parallel slots decode faster "
                               "(bench/bench_repeatable.py); recorded in run.json")
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
class Evaluator:
    """One evaluation in a results directory: the backends (built lazily), every method's run chunk by chunk from
    the stored round 0 (`eval.chunk_runner.ChunkRunner`), and the report (`eval.run_report.Reporter`)."""

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
                                 agent_profiles=self.profiles, logprobs=settings.logprobs)
        # Round 0 holds enough independent answers for every method: V, or the self-consistency samples.
        self.round0_width = M.round0_width(settings.methods, settings.n_agents, settings.sc_samples)
        self.chunks = ChunkRunner(settings, self.base, ckpt, self.results, self.backend, self.encoder)
        self.reporter = Reporter(settings, specs, ckpt, self.results, self.questions)

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
        plan, todo = self._plan()
        first = [s for s in self.specs if s.selection_mode != "random" or s.kind != "dear"]
        last = [s for s in self.specs if s not in first]
        total = sum(len(v) for v in todo.values())
        if total == 0:
            log.info("nothing to do: all questions of all methods are finished")
            return
        timings = self.results.timings()
        # Tokens and elapsed time move while a chunk's debates run; questions count when a method's chunk ends.
        with LiveProgress(total, "eval", unit="q", tokens=GENERATED_TOKENS.total, enabled=self.s.progress,
                          replayed=REPLAYED_TOKENS.total) as bar:
            for specs in (first, last):
                for k, b, chunk in plan:
                    self._run_chunk(specs, k, b, chunk, todo, timings, bar)
        self.results.save_timings(timings)

    def _plan(self) -> tuple[list[tuple[int, str, list[Question]]], dict[tuple[str, str], set[str]]]:
        """The chunks (index, benchmark, questions) in chunk-major order, and each method's unfinished questions."""
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
        return plan, todo

    def _run_chunk(self, specs: list[M.MethodSpec], k: int, b: str, chunk: list[Question],
                   todo: dict[tuple[str, str], set[str]], timings: dict[str, float], bar: LiveProgress) -> None:
        """Chunk k of benchmark b: its stored round 0 completed, then every method of `specs` that has not finished
        these questions, each method's traces appended as it ends."""
        work = {spec: [q for q in chunk if q.id in todo[(b, spec.name)]] for spec in specs}
        need = [q for q in chunk if any(q in qs for qs in work.values())]
        if not need:
            return
        bar.set_description(f"{b}/{ROUND0}")
        round0 = self._timed(timings, b, ROUND0, self._round0, b, need)
        for spec, qs in work.items():
            ready = [q for q in qs if q.id in round0]
            if not ready:
                continue
            bar.set_description(f"{b}/{spec.name}")
            traces, regulator = self._timed(timings, b, spec.name, self.chunks.run, spec, b, ready, k, round0)
            self.results.append(b, spec.name, traces, regulator)
            bar.update(len(ready))

    def _timed(self, timings: dict[str, float], benchmark: str, name: str, fn, *args):
        """fn(*args), its wall time added to timings[benchmark/name] (saved at once: a stop loses nothing)."""
        t0 = time.perf_counter()
        out = fn(*args)
        key = f"{benchmark}/{name}"
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        self.results.save_timings(timings)
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

    # -- report (eval/run_report.py)
    def label(self, spec: M.MethodSpec) -> str:
        return self.reporter.label(spec)

    def collect(self) -> Collected:
        return self.reporter.collect()

    def report(self, command: str) -> list[report.MethodResult]:
        """Summary, CSV and plots of `collect`'s results, written into the results directory."""
        return self.reporter.report(command, self.synthetic)


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
    confidence_rules = any(s.reads_confidence for s in specs)
    rule_params = str(Path(a.rule_params or DEFAULT_RULE_PARAMS).resolve()) if confidence_rules else None
    if rule_params:
        FittedParams.load(rule_params)  # a clear error before any model loads
    observes = ckpt is not None and ckpt.reads_confidence
    out = a.out or default_out(benchmarks, a.n, a.seed)
    opts: dict[str, Any] = {}
    if a.parallel:
        opts["n_parallel"] = a.parallel
    if a.n_ctx:
        opts["n_ctx"] = a.n_ctx
    if a.speculative:
        opts["speculative"] = a.speculative
    run_specs = backend_specs(profiles) if profiles else [x.strip() for x in a.llm.split(",")]
    if repeatable_of(a.repeatable, run_specs, a.parallel) and any(registry.uses_llama_cpp(x) for x in run_specs):
        opts.update(n_parallel=1, repeatable=True)  # one request at a time (dear.llm.local)
    opts.update(_sim_world(a, run_specs))
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
        logprobs=TOP_LOGPROBS if confidence_rules or observes else None, rule_params=rule_params,
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
    silently) and any other backend that takes them (dear.llm.registry.options_for: a llama.cpp one). The one slot
    of --repeatable goes to llama.cpp backends only: for a bank it is a no-op (it repeats anyway)."""
    if options.get("repeatable") and not registry.uses_llama_cpp(spec):
        options = {k: v for k, v in options.items() if k not in ("repeatable", "n_parallel")}
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
