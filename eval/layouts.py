"""Measure the exchange-round prompt layouts against each other on real debates, from one shared round 0.

    python -m eval.layouts --llm local --n 30 --out results/layout-gsm8k

Round 0 of each question is generated once and stored (`round0.jsonl`). Every arm (layout x protocol: MAD's full
mesh and a fixed sparse ring, where agent i reads agent i+1) continues the same stored round 0 for the same
number of exchange rounds, so arms differ only in the layout and the mask. Questions run in chunks of `--chunk`
debates; within a chunk the arms run one after another (rotating their order from chunk to chunk), each alone
on the backend, so every arm's wall time is its own. Finished chunk-arms are appended to `arms.jsonl` as they
end: a stop loses at most the chunk-arm in flight, and the same command continues. `summary.md` and
`summary.csv` are rewritten after every chunk, with accuracy, transitions, completion tokens, prompt tokens the
server computed (not reused from its KV cache) and wall time, each paired between the layouts.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dear import tasks
from dear.cli import require_at_least
from dear.cli import run as run_cli
from dear.debate.cli_args import REQUIRED, add_backend_args, add_debate_args, add_output_args, add_question_args
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.prompts import LAYOUTS
from dear.debate.protocols import FixedMaskProtocol, MADProtocol, Protocol
from dear.debate.trace import DebateTrace
from dear.llm.base import GENERATED_TOKENS, Backend
from dear.llm.registry import is_synthetic, make_backend, options_for
from dear.metrics import bootstrap_ci, paired_bootstrap_diff, round_scores, transitions
from dear.progress import LiveProgress
from dear.settings_guard import DebateRunSettings, open_run_dir
from dear.tasks.types import Question

log = logging.getLogger("eval.layouts")
PROG = "python -m eval.layouts"
PROTOCOL_NAMES = ("mad", "ring")
MIN_QUESTIONS = 30  # the comparison the default layout rests on needs at least this many questions


@dataclass(frozen=True)
class Arm:
    layout: str
    protocol: str

    @property
    def name(self) -> str:
        return f"{self.protocol}/{self.layout}"


ARMS = tuple(Arm(layout, proto) for proto in PROTOCOL_NAMES for layout in LAYOUTS)


@dataclass(frozen=True)
class LayoutSettings(DebateRunSettings):
    """Everything that must stay the same for a resumed run to extend the same experiment."""

    n_ctx: int
    parallel: int
    chunk: int
    temperature: float
    top_p: float


def ring_mask(n_agents: int) -> np.ndarray:
    """Agent i reads agent i+1 (mod V): every agent reads exactly one peer and is read by exactly one."""
    mask = np.zeros((n_agents, n_agents), dtype=bool)
    mask[np.arange(n_agents), (np.arange(n_agents) + 1) % n_agents] = True
    return mask


def make_arm_protocol(protocol: str, s: LayoutSettings) -> Protocol:
    if protocol == "mad":
        return MADProtocol(s.n_agents, s.n_rounds, s.temperature, s.top_p)
    if protocol == "ring":
        proto = FixedMaskProtocol(ring_mask(s.n_agents), s.n_rounds, s.temperature, s.top_p)
        proto.name = "ring"
        return proto
    raise ValueError(f"unknown protocol {protocol!r}; known: {PROTOCOL_NAMES}")


# ---------------------------------------------------------------- the run directory
class LayoutRunDir:
    """settings.json (guarded), round0.jsonl (one stored round 0 per question), arms.jsonl (finished arms)."""

    def __init__(self, root: Path, settings: LayoutSettings):
        self.root = open_run_dir(root, settings)
        self.round0 = {t.question_id: t for t in self._read(self.root / "round0.jsonl", "trace")}
        self.done = {(r["arm"], r["trace"]["question_id"]) for r in self._read(self.root / "arms.jsonl")}

    @staticmethod
    def _read(path: Path, field: str | None = None) -> list:
        if not path.exists():
            return []
        out = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    out.append(DebateTrace.from_dict(row) if field == "trace" else row)
                except (ValueError, TypeError) as e:
                    if not line.endswith("\n"):  # a line cut by a kill: the chunk-arm is simply redone
                        log.warning("%s:%d is incomplete; ignoring it", path, lineno)
                        continue
                    raise ValueError(f"{path}:{lineno}: {e}") from None
        return out

    def append(self, name: str, rows: Sequence[dict]) -> None:
        with (self.root / name).open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()

    def records(self) -> list[dict]:
        return self._read(self.root / "arms.jsonl")


# ---------------------------------------------------------------- running
def run_chunk(engine_for: dict[str, DebateEngine], questions: Sequence[Question], run: LayoutRunDir, s: LayoutSettings,
              chunk_index: int, progress: LiveProgress | None = None) -> None:
    """Round 0 (unless stored), then every unfinished arm on this chunk's questions; `progress` counts each arm's
    debates as they are recorded."""
    missing = [q for q in questions if q.id not in run.round0]
    if missing:
        debates = engine_for[LAYOUTS[0]].start(missing, protocol="round0")
        failed = [d for d in debates if d.failed]
        if failed:
            raise RuntimeError(f"round 0 failed for {len(failed)} question(s): {failed[0].error}")
        run.append("round0.jsonl", [d.trace.to_dict() for d in debates])
        run.round0.update({d.question.id: d.trace for d in debates})
    shift = chunk_index % len(ARMS)
    for arm in ARMS[shift:] + ARMS[:shift]:  # rotate so no arm always runs first on a fresh cache
        todo = [q for q in questions if (arm.name, q.id) not in run.done]
        if not todo:
            continue
        engine = engine_for[arm.layout]
        protocol = make_arm_protocol(arm.protocol, s)
        stored = [run.round0[q.id] for q in todo]
        debates = engine.start_from_round0(todo, [t.rounds[0] for t in stored],
                                           debate_seeds=[t.seed for t in stored], protocol=arm.name)
        t0 = time.perf_counter()
        while active := [d for d in debates if not d.done]:
            engine.step(active, protocol.controls(active))
        wall = time.perf_counter() - t0
        failed = [d for d in debates if d.failed]
        if failed:  # never record a failed arm: the same command redoes it
            log.error("%s: %d debate(s) failed, e.g. %s; not recorded", arm.name, len(failed), failed[0].error)
            continue
        run.append("arms.jsonl", [
            {"arm": arm.name, "chunk": chunk_index, "chunk_wall_s": wall, "chunk_size": len(debates),
             "llama_threads": os.environ.get("DEAR_LLAMA_THREADS", "auto"), "trace": d.trace.to_dict()}
            for d in debates
        ])
        run.done.update((arm.name, d.question.id) for d in debates)
        if progress is not None:
            progress.update(len(debates))
        log.info("chunk %d %s: %.1fs", chunk_index, arm.name, wall)


# ---------------------------------------------------------------- the report
@dataclass(frozen=True)
class ArmRow:
    """Per-question arrays of one arm, aligned on the questions every arm finished."""

    final: np.ndarray
    round_acc: np.ndarray  # (n, R+1) plurality score per round
    transitions: np.ndarray  # (4,) C->C, C->I, I->C, I->I summed over exchange rounds and agents
    completion: np.ndarray
    computed_prompt: np.ndarray
    reused_prompt: np.ndarray
    truncated_turns: int
    no_answer_turns: int
    turns: int
    wall_by_chunk: dict[int, float]


def _exchange_turns(trace: DebateTrace):
    return [t for turns in trace.rounds[1:] for t in turns]


def arm_row(recs: Sequence[dict]) -> ArmRow:
    traces = [DebateTrace.from_dict(r["trace"]) for r in recs]
    wall: dict[int, float] = {}
    for r in recs:
        wall[r["chunk"]] = r["chunk_wall_s"]
    turns = [t for tr in traces for t in _exchange_turns(tr)]
    return ArmRow(
        final=np.array([tr.final_expected for tr in traces], dtype=float),  # ties as expected values
        round_acc=np.array([round_scores(tr.answer_keys(), tr.correctness()) for tr in traces]),
        transitions=sum((transitions(tr.correctness()).sum(0) for tr in traces), np.zeros(4, dtype=int)),
        completion=np.array([sum(t.completion_tokens for t in _exchange_turns(tr)) for tr in traces], float),
        computed_prompt=np.array([sum(t.computed_prompt_tokens for t in _exchange_turns(tr)) for tr in traces],
                                 float),
        reused_prompt=np.array([sum(t.reused_prompt_tokens for t in _exchange_turns(tr)) for tr in traces], float),
        truncated_turns=sum(t.finish_reason == "length" for t in turns),
        no_answer_turns=sum(t.answer is None for t in turns),
        turns=len(turns),
        wall_by_chunk=wall,
    )


def _ci(c, scale: float = 1.0, digits: int = 1) -> str:
    return f"{c.mean * scale:.{digits}f} [{c.low * scale:.{digits}f}, {c.high * scale:.{digits}f}]"


def write_report(run: LayoutRunDir, s: LayoutSettings, n_boot: int = 2000) -> str | None:
    recs = run.records()
    by_arm: dict[str, dict[str, dict]] = {}
    for r in recs:
        by_arm.setdefault(r["arm"], {})[r["trace"]["question_id"]] = r
    common = sorted(set.intersection(*(set(by_arm.get(a.name, {})) for a in ARMS))) if by_arm else []
    if not common:
        return None
    chunks = sorted({by_arm[ARMS[0].name][q]["chunk"] for q in common})
    full_chunks = [c for c in chunks if all(by_arm[a.name][q]["chunk"] == c for a in ARMS for q in common
                                            if by_arm[ARMS[0].name][q]["chunk"] == c)]
    rows = {a.name: arm_row([by_arm[a.name][q] for q in common]) for a in ARMS}
    n = len(common)
    r0 = rows[ARMS[0].name].round_acc[:, 0]
    lines = [
        f"# Exchange-round layouts, paired on one shared round 0 ({s.task} {s.split}, n = {n} questions)",
        "",
        "Command: `python -m eval.layouts " + " ".join(_cli_args(s)) + "`",
        "",
        f"Real LLM (`{s.llm}`), V = {s.n_agents}, R = {s.n_rounds} exchange rounds, {s.max_tokens} max tokens, "
        f"{s.parallel} llama.cpp slots, {s.chunk} debates per chunk, seed {s.seed}, data seed {s.data_seed}. "
        "Tokens and wall time are those of the exchange rounds (round 0 is shared and paid once). "
        "'Computed prompt' = prompt tokens the server read, i.e. not reused from its KV cache. "
        f"CIs: 95 %, paired bootstrap over questions ({n_boot} resamples, seed 0).",
        "",
        f"Round-0 plurality accuracy (shared): {_ci(bootstrap_ci(r0, n_boot), 100)} %.",
        "",
        "| arm | final acc % [95 % CI] | round 1 / 2 acc % | C→I | I→C | completion tok/q | computed prompt tok/q "
        "| reused prompt tok/q | wall s/q | cut at limit | no answer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    csv_rows = []
    for a in ARMS:
        row = rows[a.name]
        wall = sum(row.wall_by_chunk[c] for c in full_chunks) / max(1, n)
        acc = bootstrap_ci(row.final, n_boot)
        t = row.transitions
        lines.append(
            f"| {a.name} | {_ci(acc, 100)} | {100 * row.round_acc[:, 1].mean():.1f} / "
            f"{100 * row.round_acc[:, -1].mean():.1f} | {t[1]} | {t[2]} | {row.completion.mean():.0f} | "
            f"{row.computed_prompt.mean():.0f} | {row.reused_prompt.mean():.0f} | {wall:.1f} | "
            f"{row.truncated_turns}/{row.turns} | {row.no_answer_turns}/{row.turns} |"
        )
        csv_rows.append({"arm": a.name, "llm": s.llm, "synthetic": is_synthetic(s.llm), "n": n,
                         "accuracy": acc.mean, "acc_lo": acc.low, "acc_hi": acc.high,
                         "c_to_i": int(t[1]), "i_to_c": int(t[2]),
                         "completion_tokens_per_q": row.completion.mean(),
                         "computed_prompt_tokens_per_q": row.computed_prompt.mean(),
                         "reused_prompt_tokens_per_q": row.reused_prompt.mean(), "wall_s_per_q": wall})
    lines += ["", "Paired, multiturn − single (same questions, same round 0):", "",
              "| protocol | Δ accuracy pp [95 % CI] | Δ completion tok/q | Δ computed prompt tok/q | "
              "wall multiturn / single [95 % CI] |", "|---|---|---|---|---|"]
    for proto in PROTOCOL_NAMES:
        mt, sg = rows[f"{proto}/multiturn"], rows[f"{proto}/single"]
        acc = paired_bootstrap_diff(mt.final, sg.final, n_boot)
        comp = paired_bootstrap_diff(mt.completion, sg.completion, n_boot)
        prompt = paired_bootstrap_diff(mt.computed_prompt, sg.computed_prompt, n_boot)
        ratio = _wall_ratio(mt.wall_by_chunk, sg.wall_by_chunk, full_chunks, n_boot)
        lines.append(f"| {proto} | {_ci(acc, 100)} | {_ci(comp, 1, 0)} | {_ci(prompt, 1, 0)} | {ratio} |")
    lines += ["", _verdict(rows, full_chunks, n_boot), ""]
    text = "\n".join(lines)
    (run.root / "summary.md").write_text(text)
    with (run.root / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(csv_rows[0]))
        w.writeheader()
        w.writerows(csv_rows)
    return text


def _wall_ratio(a: dict[int, float], b: dict[int, float], chunks: Sequence[int], n_boot: int) -> str:
    x = np.array([a[c] for c in chunks])
    y = np.array([b[c] for c in chunks])
    if not len(chunks):
        return "-"
    idx = np.random.default_rng(0).integers(0, len(chunks), size=(n_boot, len(chunks)))
    ratios = x[idx].sum(1) / y[idx].sum(1)
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    return f"{x.sum() / y.sum():.2f} [{lo:.2f}, {hi:.2f}]"


def _verdict(rows: dict[str, ArmRow], chunks: Sequence[int], n_boot: int) -> str:
    """The default-layout rule, applied: not worse in accuracy (the paired CI of multiturn − single does not lie
    wholly below 0, for both protocols) and faster (less exchange-round wall time over both protocols)."""
    not_worse = all(
        paired_bootstrap_diff(rows[f"{p}/multiturn"].final, rows[f"{p}/single"].final, n_boot).high >= 0
        for p in PROTOCOL_NAMES
    )
    wall = {lay: sum(rows[f"{p}/{lay}"].wall_by_chunk[c] for p in PROTOCOL_NAMES for c in chunks) for lay in LAYOUTS}
    faster = wall["multiturn"] < wall["single"]
    pick = "multiturn" if not_worse and faster else "single"
    n = len(rows[ARMS[0].name].final)
    status = "" if n >= MIN_QUESTIONS else f" (provisional: n = {n} < {MIN_QUESTIONS} questions, the size the rule needs)"
    return (f"Rule: the default is the layout that is not worse in accuracy (paired CI) and is faster. "
            f"Multiturn not worse in accuracy: {'yes' if not_worse else 'no'}; exchange-round wall time "
            f"multiturn {wall['multiturn']:.0f} s vs single {wall['single']:.0f} s. Reading: **{pick}**{status}.")


def _cli_args(s: LayoutSettings) -> list[str]:
    return [f"--task {s.task}", f"--split {s.split}", f"--data-seed {s.data_seed}", f"--seed {s.seed}",
            f"--llm {s.llm}", f"--n-agents {s.n_agents}", f"--n-rounds {s.n_rounds}", f"--max-tokens {s.max_tokens}",
            f"--n-ctx {s.n_ctx}", f"--parallel {s.parallel}", f"--chunk {s.chunk}", "--n N", "--out DIR"]


# ---------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_question_args(p, split="train", split_note="train by default: keeps the test questions for evaluation",
                      n=30, n_note="a resumed run may grow it", data_seed=13)
    add_backend_args(p, max_tokens=384, parallel=6, parallel_note=">= chunk x agents keeps sessions on slots",
                     n_ctx=3072)
    add_debate_args(p, sampling=True)
    p.add_argument("--chunk", type=int, default=2, help="debates run together")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of the paired CIs")
    add_output_args(p, out_help="results directory (continued if it exists)", out=REQUIRED, path=True,
                    report_only="rewrite summary.md/csv from what has finished", verbose=True)
    return p.parse_args(argv)


def settings_from_args(a: argparse.Namespace) -> LayoutSettings:
    require_at_least(a, 1, "n", "n_agents", "max_tokens", "n_ctx", "parallel", "chunk")
    return LayoutSettings(**DebateRunSettings.shared_from_args(a), n_ctx=a.n_ctx, parallel=a.parallel,
                          chunk=a.chunk, temperature=a.temperature, top_p=a.top_p)


def build_backend(s: LayoutSettings) -> Backend:
    return make_backend(s.llm, **options_for(s.llm, {"n_parallel": s.parallel, "n_ctx": s.n_ctx}))


def main(argv: Sequence[str] | None = None, backend: Backend | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    s = settings_from_args(a)
    run = LayoutRunDir(a.out, s)
    if a.report_only:
        print(write_report(run, s, a.n_boot) or "nothing finished yet")
        return 0
    questions = tasks.load(s.task, split=s.split, n=a.n, seed=s.data_seed)
    own_backend = backend is None
    backend = backend or build_backend(s)
    try:
        base = DebateConfig(n_agents=s.n_agents, n_rounds=s.n_rounds, temperature0=s.temperature,
                            top_p0=s.top_p, max_tokens=s.max_tokens, seed=s.seed)
        engines = {lay: DebateEngine(backend, DebateConfig(**{**asdict(base), "layout": lay})) for lay in LAYOUTS}
        chunks = [questions[i:i + s.chunk] for i in range(0, len(questions), s.chunk)]
        todo = sum((arm.name, q.id) not in run.done for arm in ARMS for q in questions)
        with LiveProgress(todo, "layouts", unit="debate", tokens=GENERATED_TOKENS.total) as progress:
            for k, chunk in enumerate(chunks):
                if all((arm.name, q.id) in run.done for arm in ARMS for q in chunk):
                    continue
                t0 = time.perf_counter()
                run_chunk(engines, chunk, run, s, k, progress)
                progress.write(f"chunk {k + 1}/{len(chunks)} done in {time.perf_counter() - t0:.0f}s")
                write_report(run, s, a.n_boot)
    finally:
        if own_backend:
            backend.close()
    text = write_report(run, s, a.n_boot)
    print(text or "nothing finished")
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
