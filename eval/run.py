"""`python -m eval.run`: a trained DEAR policy zero-shot vs the baselines, on the same questions, seeds and model.

    python -m eval.run --checkpoint runs/gsm8k --benchmarks math500,gpqa_diamond --n 100 --llm local

Results directory (``--out``): ``traces/<benchmark>/<method>.jsonl`` (one DebateTrace per line; DEAR methods
also ``<method>.regulator.jsonl`` with the beliefs, masks and sampling the policy chose), ``summary.csv``,
``summary.md``, PNG plots, ``run.json`` (the settings), ``done.tsv`` (finished benchmark/method/question) and
``cache.sqlite`` (the response cache). Re-running the same command continues where it stopped: finished
questions are skipped (done-list) and repeated requests are answered from the cache.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dear import tasks
from dear.debate import DebateConfig, DebateEngine
from dear.debate.engine import Debate
from dear.debate.trace import DebateTrace, read_jsonl
from dear.llm.base import Backend
from dear.tasks.types import Question
from eval import methods as M
from eval import plots, report

log = logging.getLogger("eval")

# Settings that must not change inside one results directory (they change the questions or the answers).
# `--n` may change: a subset is the first n of a seeded shuffle, so a larger n extends a smaller one.
_FIXED_SETTINGS = ("llm", "seed", "agents", "rounds", "max_tokens", "temperature", "top_p", "sc_samples",
                   "checkpoint", "encoder")


@dataclass
class EvalSettings:
    benchmarks: list[str]
    methods: list[str]
    n: int | None
    llm: str
    seed: int
    agents: int
    rounds: int
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
    p.add_argument("--checkpoint", help="training run dir, checkpoint dir or exported policy (needed by DEAR methods)")
    p.add_argument("--benchmarks", required=True, help="comma-separated task names, e.g. gsm8k,math500")
    p.add_argument("--n", type=int, default=100, help="questions per benchmark (seeded subset; 0 = all)")
    p.add_argument("--llm", default="local", help="backend spec: local | smoke | sim | openai:URL | vllm:MODEL")
    p.add_argument("--methods", default="all", help=f"comma-separated, or all: {','.join(M.METHODS)}")
    p.add_argument("--seed", type=int, default=0, help="question subset, sampling seeds, tie-breaks, bootstrap")
    p.add_argument("--out", help="results directory (default results/eval-<benchmarks>-n<N>-s<seed>)")
    p.add_argument("--agents", type=int, help="V (default: the checkpoint's, else 3)")
    p.add_argument("--rounds", type=int, help="exchange rounds R (default: the checkpoint's, else 2)")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.7, help="round-0 and fixed sampling temperature")
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--sc-samples", type=int, help="self-consistency samples (default V*(R+1): MAD's call budget)")
    p.add_argument("--encoder", help="override the checkpoint's encoder spec (the policy was trained on its own)")
    p.add_argument("--temp-range", help="expected temperature range lo,hi; error if the checkpoint differs")
    p.add_argument("--top-p-range", help="expected top-p range lo,hi; error if the checkpoint differs")
    p.add_argument("--batch", type=int, default=8, help="questions per engine batch (and per done-list flush)")
    p.add_argument("--cache", help="response cache path (default OUT/cache.sqlite)")
    p.add_argument("--no-cache", action="store_true", help="do not use a response cache")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples for CIs")
    p.add_argument("--report-only", action="store_true", help="rebuild summary and plots from existing traces")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--parallel", type=int, help="llama.cpp parallel slots (local/smoke backends)")
    p.add_argument("--n-ctx", type=int, help="llama.cpp context tokens per slot (local/smoke backends)")
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
        """Traces first (fsynced), then the done-list: a crash between the two only redoes the batch."""
        path = self.trace_path(benchmark, method)
        path.parent.mkdir(parents=True, exist_ok=True)
        _append_lines(path, [t.to_json() for t in traces])
        if regulator is not None:
            from dear.regulator import decisions_json  # torch-heavy: only DEAR methods need it

            _append_lines(self.regulator_path(benchmark, method), [
                decisions_json(t.debate_id, t.question_id, regulator.get(t.debate_id, [])) for t in traces])
        _append_lines(self.done_path, [f"{benchmark}\t{method}\t{t.question_id}" for t in traces])

    def load(self, benchmark: str, method: str, question_ids: Sequence[str]) -> list[DebateTrace]:
        """Finished traces of the given questions in question order (last write wins)."""
        path = self.trace_path(benchmark, method)
        if not path.exists():
            return []
        done = {q for b, m, q in self.done() if b == benchmark and m == method}
        latest = {t.question_id: t for t in read_jsonl(path) if t.question_id in done}
        return [latest[q] for q in question_ids if q in latest]


def _append_lines(path: Path, lines: Sequence[str]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _check_settings(root: Path, settings: EvalSettings) -> dict[str, Any]:
    """Refuse to mix runs with different settings in one results directory; returns the stored run.json."""
    path = root / "run.json"
    current = asdict(settings)
    if path.exists():
        stored = json.loads(path.read_text())
        diff = {k: (stored.get("settings", {}).get(k), current[k]) for k in _FIXED_SETTINGS
                if stored.get("settings", {}).get(k) != current[k]}
        if diff:
            raise ValueError(
                f"{root} holds an evaluation with different settings "
                + ", ".join(f"{k}: {a!r} there vs {b!r} now" for k, (a, b) in diff.items())
                + "; use another --out (or the original settings to resume)"
            )
        return stored
    return {"settings": current}


# ---------------------------------------------------------------- the runner
class Evaluator:
    def __init__(self, settings: EvalSettings, specs: list[M.MethodSpec], ckpt: M.Checkpoint | None,
                 backend: Backend | None = None):
        self.s = settings
        self.specs = specs
        self.ckpt = ckpt
        self.results = ResultsDir(Path(settings.out))
        self._backend = backend  # built lazily: a finished run rebuilds its report without loading a model
        self._encoder = None
        self.model_id: str | None = backend.model_id if backend else None
        self.synthetic: bool | None = backend.synthetic if backend else None
        self.base = DebateConfig(n_agents=settings.agents, n_rounds=settings.rounds,
                                 temperature0=settings.temperature, top_p0=settings.top_p,
                                 max_tokens=settings.max_tokens, seed=settings.seed)

    # -- lazily built heavy parts
    def backend(self) -> Backend:
        if self._backend is None:
            from dear.llm.cache import CachedBackend
            from dear.llm.registry import make_backend

            inner = make_backend(self.s.llm, **self.s.backend_options)
            cache = self.s.cache if self.s.cache is not None else str(Path(self.s.out) / "cache.sqlite")
            self._backend = CachedBackend(inner, cache) if cache else inner
            self.model_id, self.synthetic = self._backend.model_id, self._backend.synthetic
            log.info("backend %s (model %s)%s", self.s.llm, self.model_id, " [synthetic]" if self.synthetic else "")
        return self._backend

    def encoder(self):
        if self._encoder is None:
            from dear.evidence import make_encoder

            self._encoder = make_encoder(self.s.encoder or self.ckpt.encoder)
        return self._encoder

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()

    # -- work
    def questions(self, benchmark: str) -> list[Question]:
        return tasks.load(benchmark, n=self.s.n or None, seed=self.s.seed)

    def run(self) -> None:
        """Chunk-major order (chunk k of every benchmark and method before chunk k+1), so an evaluation cut
        short still compares all methods on the same questions; the cache serves shared round-0 calls."""
        done = self.results.done()
        plan = []
        for b in self.s.benchmarks:
            qs = self.questions(b)
            ids = [q.id for q in qs]
            if len(set(ids)) != len(ids):
                raise ValueError(f"benchmark {b}: duplicate question ids in the subset")
            for k in range((len(qs) + self.s.batch - 1) // self.s.batch):
                chunk = qs[k * self.s.batch:(k + 1) * self.s.batch]
                for spec in self.specs:
                    todo = [q for q in chunk if (b, spec.name, q.id) not in done]
                    if todo:
                        plan.append((k, b, spec, todo))
        plan.sort(key=lambda item: item[0])  # stable: benchmarks and methods keep their order within a chunk
        total = sum(len(chunk) for *_, chunk in plan)
        if total == 0:
            log.info("nothing to do: all questions of all methods are finished")
            return
        timings = self._timings()
        with tqdm(total=total, desc="eval", unit="q", disable=not self.s.progress, dynamic_ncols=True) as bar:
            for k, b, spec, chunk in plan:
                bar.set_description(f"{b}/{spec.name}")
                t0 = time.perf_counter()
                traces, regulator = self._run_chunk(spec, chunk, k)
                self.results.append(b, spec.name, traces, regulator)
                key = f"{b}/{spec.name}"
                timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
                self._save_timings(timings)
                bar.update(len(chunk))

    def _run_chunk(self, spec: M.MethodSpec, chunk: list[Question], chunk_index: int):
        from dear.debate.engine import derive_seed

        backend = self.backend()
        run = M.build(spec, self.base, self.s.sc_samples, self.ckpt,
                      self.encoder() if spec.needs_checkpoint else None,
                      seed=derive_seed(self.s.seed, chunk_index, 0xD0))  # random-mask draws: fixed per chunk
        engine = DebateEngine(backend, run.config)
        debates: list[Debate] = engine.run(chunk, run.protocol)
        traces = [d.trace for d in debates]
        for t in traces:
            t.protocol = spec.name
        regulator = getattr(run.protocol, "records", None) if spec.needs_checkpoint else None
        return traces, regulator

    def _timings(self) -> dict[str, float]:
        p = Path(self.s.out) / "timings.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def _save_timings(self, timings: dict[str, float]) -> None:
        (Path(self.s.out) / "timings.json").write_text(json.dumps(timings, indent=1))

    # -- report
    def report(self, command: str) -> list[report.MethodResult]:
        results = []
        model_ids: set[str] = set()
        for b in self.s.benchmarks:
            ids = [q.id for q in self.questions(b)]
            loaded = {spec.name: self.results.load(b, spec.name, ids) for spec in self.specs}
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
                results.append(report.evaluate(b, spec.name, spec.label, traces, seed=self.s.seed,
                                               n_boot=self.s.n_boot))
        if not results:
            raise RuntimeError(f"{self.s.out}: no finished traces to report")
        out = Path(self.s.out)
        run_json = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        synthetic = bool(self.synthetic if self.synthetic is not None else run_json.get("synthetic", False))
        synthetic = synthetic or any(m.startswith("sim") for m in model_ids)
        report.write_csv(results, out / "summary.csv")
        timings = self._timings()
        meta = {
            "title": "DEAR evaluation" + (" (SYNTHETIC)" if synthetic else ""),
            "synthetic": synthetic,
            "command": command,
            "model": ", ".join(sorted(model_ids)) + f" (`--llm {self.s.llm}`)",
            "checkpoint": self._checkpoint_note(),
            "seed": f"{self.s.seed} (question subset, sampling seeds, tie-breaks, bootstrap)",
            "n": self.s.n or "all",
            "debate": (f"V={self.s.agents} agents, R={self.s.rounds} exchange rounds, round-0/fixed sampling "
                       f"T={self.s.temperature}, top-p={self.s.top_p}, max_tokens={self.s.max_tokens}, "
                       f"self-consistency samples={self.s.sc_samples}"),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_time": f"{sum(timings.values()) / 60:.1f} min of generation over all runs of this directory"
                         if timings else "",
            "notes": [
                ("Shared work: all methods use the same questions, model, seeds and round-0 sampling; round 0 of "
                "MAD is the round-0 majority's input, single CoT is agent 0 of that round 0, and DEAR and its "
                "ablations share the same round 0 (identical requests, answered once via the response cache). "
                "Every method is still charged the tokens of all its calls."),
            ],
        }
        (out / "summary.md").write_text(report.markdown(results, meta, seed=self.s.seed), encoding="utf-8")
        plots.write_all(results, out, synthetic=synthetic)
        run_json["synthetic"] = synthetic
        (out / "run.json").write_text(json.dumps(run_json, indent=1))
        return results

    def _checkpoint_note(self) -> str:
        if self.ckpt is None:
            return ""
        c = self.ckpt
        note = f"{c.path} (trained with {c.trained_on or 'unknown backend'}; encoder {self.s.encoder or c.encoder})"
        if c.synthetic and not (self.synthetic or False):
            note += " — **sim-to-real transfer**: the policy was trained on the synthetic sim backend"
        return note


def settings_from_args(a: argparse.Namespace, ckpt: M.Checkpoint | None,
                       specs: list[M.MethodSpec]) -> EvalSettings:
    benchmarks = [b.strip() for b in a.benchmarks.split(",") if b.strip()]
    if not benchmarks:
        raise ValueError("--benchmarks is empty")
    known = tasks.task_names()
    unknown = [b for b in benchmarks if b not in known]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; known: {', '.join(known)}")
    if a.n < 0:
        raise ValueError(f"--n must be >= 0, got {a.n}")
    if a.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {a.batch}")
    agents = a.agents or (ckpt.policy_config.n_agents if ckpt else 3)
    rounds = a.rounds if a.rounds is not None else (ckpt.n_rounds if ckpt and ckpt.n_rounds is not None else 2)
    if ckpt is not None:
        M.check_compatible(ckpt, agents, _range(a.temp_range, "--temp-range"), _range(a.top_p_range, "--top-p-range"))
    out = a.out or f"results/eval-{'-'.join(benchmarks)}-n{a.n}-s{a.seed}"
    opts: dict[str, Any] = {}
    if a.parallel:
        opts["n_parallel"] = a.parallel
    if a.n_ctx:
        opts["n_ctx"] = a.n_ctx
    return EvalSettings(
        benchmarks=benchmarks, methods=[s.name for s in specs], n=a.n, llm=a.llm, seed=a.seed, agents=agents,
        rounds=rounds, max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p,
        sc_samples=a.sc_samples or agents * (rounds + 1), checkpoint=str(Path(a.checkpoint).resolve()) if ckpt else None,
        encoder=a.encoder or (ckpt.encoder if ckpt else None), out=out, batch=a.batch,
        cache="" if a.no_cache else a.cache, n_boot=a.n_boot, progress=not a.no_progress, backend_options=opts,
    )


def main(argv: Sequence[str] | None = None, backend: Backend | None = None) -> list[report.MethodResult]:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per loopback request is noise
    a = parse_args(argv)
    specs = M.parse_methods(a.methods)
    ckpt = None
    if any(s.needs_checkpoint for s in specs):
        if not a.checkpoint:
            need = [s.name for s in specs if s.needs_checkpoint]
            raise ValueError(f"methods {need} need --checkpoint (a training run dir or an exported policy)")
        ckpt = M.load_checkpoint(a.checkpoint)
    elif a.checkpoint:
        log.info("--checkpoint is ignored: no DEAR method selected")
    settings = settings_from_args(a, ckpt, specs)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    stored = _check_settings(out, settings)
    (out / "run.json").write_text(json.dumps(stored, indent=1))
    command = "python -m eval.run " + shlex.join(argv)
    if not a.report_only:  # the report names the command that produced the traces, not a re-render
        stored.setdefault("commands", []).append(command)
        (out / "run.json").write_text(json.dumps(stored, indent=1))
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
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
