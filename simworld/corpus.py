"""Collect a corpus of logged debates for fitting the simulator: resumable, append-only, gzip JSONL.

    python -m simworld.corpus --llm local --n-logging 96 --n-mad 24 --layout multiturn --out results/corpus-gsm8k

Two kinds of debates on disjoint questions (GSM8K train by default, V = 3, R = 2, 384 max tokens):

- `logging`: a logging policy that covers the action space. In every exchange round every ordered pair bit
  (i reads j) is Bernoulli(`--mask-p`), and every agent's temperature and top-p are uniform over
  `--temperature-range` / `--top-p-range` (the train config's ranges), drawn independently per agent and round
  from an RNG seeded by (seed, debate id, round), so a debate's actions do not depend on scheduling. Round 0 is
  the engine's (T0 = 0.7, top-p 0.9), as in the RL environment. Each record carries the log-probability of the
  mask and the log-densities of the sampling values it drew.
- `mad`: full-mesh MAD reference debates (T 0.7, top-p 0.9).

Questions: one seeded permutation of the split (`--data-seed`); logging debates take its even positions, MAD
debates its odd positions, so the two sets are disjoint and a larger `--n-logging` / `--n-mad` extends them.
`--repeats K` gives every logging question K debates with distinct seeds (repeat 0 is the first debate, so a
larger K grows an existing corpus): more real texts per answer class for the simulator's text bank.

Layout of `--out`: `settings.json` (guarded: a resumed run must use the same settings), `corpus.jsonl.gz` (one
gzip member per finished debate, each one JSON line `{"kind", "layout", "policy", "trace"}`; `trace` is a full
DebateTrace: every prompt, completion, parsed answer, mask, temperature, top-p and token count) and
`PROVENANCE.md` (rewritten at the end of each run). Debates run with `DebateEngine.run_concurrent` and are
appended as each finishes. SIGINT or SIGTERM (`dear.cli.run`, also for a job started in the background) starts no
new debate, lets the ones in flight finish and be kept, and writes PROVENANCE.md; a harder kill loses at most the
debates in flight (a member it cut is dropped when the file is next opened). The same command continues. Failed debates are not recorded, so they are redone.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import logging
import math
import re
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dear import tasks
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.cli_args import (
    REQUIRED,
    add_backend_args,
    add_debate_args,
    add_output_args,
    add_question_args,
    n_agents_of,
)
from dear.debate.corpus_file import CORPUS_FILE, gzip_members, iter_traces, read_corpus  # noqa: F401 (readers re-exported)
from dear.debate.engine import Debate, DebateConfig, DebateEngine, RoundControl, debate_id_of, default_debate_seed
from dear.debate.profiles import AgentProfile, as_profiles, backend_specs, on_backend
from dear.debate.protocols import MADProtocol
from dear.llm.base import GENERATED_TOKENS, Backend
from dear.llm.registry import is_synthetic, make_backend, model_file, options_for
from dear.policy import DEFAULT_TEMPERATURE_RANGE, DEFAULT_TOP_P_RANGE  # the ranges training uses
from dear.progress import LiveProgress
from dear.seeds import derive_seed
from dear.settings_guard import DebateRunSettings, open_run_dir  # shared by every resumable experiment directory
from dear.tasks.loaders import subset
from dear.tasks.types import Question

log = logging.getLogger("simworld.corpus")
PROG = "python -m simworld.corpus"
KINDS = ("logging", "mad")


@dataclass(frozen=True)
class CorpusSettings(DebateRunSettings):
    """Everything that must stay the same for a resumed run to extend the same corpus."""

    layout: str
    mask_p: float
    temperature_range: tuple[float, float]
    top_p_range: tuple[float, float]
    mad_temperature: float
    mad_top_p: float
    temperature0: float
    top_p0: float
    # One profile per agent, compact form with its backend filled in (dear/debate/profiles.py); None = the paper's
    # agents on --llm (and absent from corpora collected before profiles existed).
    agent_profiles: tuple[str, ...] | None = None

    def profiles(self) -> tuple[AgentProfile, ...] | None:
        """The agent profiles as objects (None without them)."""
        return as_profiles(self.agent_profiles, "agent_profiles") if self.agent_profiles else None


# ---------------------------------------------------------------- the logging policy
@dataclass(frozen=True)
class LoggedRound:
    """What the logging policy drew for one exchange round, with its probability (density)."""

    round: int
    mask: list[list[bool]]
    temperature: list[float]
    top_p: list[float]
    log_prob_mask: float  # Σ over ordered pairs i≠j of log Bernoulli(mask_p)
    log_density_temperature: float  # Σ over agents of log U(temperature_range)
    log_density_top_p: float


class LoggingPolicy:
    """Random masks and per-agent sampling, seeded per (debate, round) so that run_concurrent can use it."""

    name = "logging"

    def __init__(self, n_agents: int, n_rounds: int, mask_p: float, temperature_range: tuple[float, float],
                 top_p_range: tuple[float, float], seed: int):
        if not 0.0 < mask_p < 1.0:
            raise ValueError(f"--mask-p must be in (0, 1), got {mask_p}")
        for flag, (lo, hi) in (("--temperature-range", temperature_range), ("--top-p-range", top_p_range)):
            if not lo < hi:
                raise ValueError(f"{flag} needs LOW < HIGH, got {lo} {hi}")
        if not 0.0 <= temperature_range[0] or temperature_range[1] > 2.0:
            raise ValueError(f"--temperature-range must lie in [0, 2], got {temperature_range}")
        if not 0.0 < top_p_range[0] or top_p_range[1] > 1.0:
            raise ValueError(f"--top-p-range must lie in (0, 1], got {top_p_range}")
        self.n_agents, self.n_rounds, self.mask_p, self.seed = n_agents, n_rounds, mask_p, seed
        self.temperature_range, self.top_p_range = tuple(temperature_range), tuple(top_p_range)

    def draw(self, debate_id: str, round_: int) -> LoggedRound:
        v = self.n_agents
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, zlib.crc32(debate_id.encode()), round_])
        mask = rng.random((v, v)) < self.mask_p
        np.fill_diagonal(mask, False)
        temperature = rng.uniform(*self.temperature_range, size=v)
        top_p = rng.uniform(*self.top_p_range, size=v)
        off = ~np.eye(v, dtype=bool)
        n_on = int(mask[off].sum())
        n_off = int(off.sum()) - n_on
        return LoggedRound(
            round=round_, mask=mask.tolist(), temperature=temperature.tolist(), top_p=top_p.tolist(),
            log_prob_mask=n_on * math.log(self.mask_p) + n_off * math.log1p(-self.mask_p),
            log_density_temperature=-v * math.log(self.temperature_range[1] - self.temperature_range[0]),
            log_density_top_p=-v * math.log(self.top_p_range[1] - self.top_p_range[0]),
        )

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        out = []
        for d in debates:
            drawn = self.draw(d.debate_id, d.round + 1)
            out.append(RoundControl(np.array(drawn.mask), np.array(drawn.temperature), np.array(drawn.top_p)))
        return out

    def describe(self, debate_id: str) -> dict[str, Any]:
        """The policy's definition and its draws for one debate (what the record stores)."""
        return {"mask_p": self.mask_p, "temperature_range": list(self.temperature_range),
                "top_p_range": list(self.top_p_range), "seed": self.seed,
                "rounds": [asdict(self.draw(debate_id, r)) for r in range(1, self.n_rounds + 1)]}


# ---------------------------------------------------------------- the gzip member file
class CorpusFile:
    """Append-only gzip JSONL, one member per record; a member cut by a kill is trimmed when opened."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.records: list[dict] = []
        if path.exists():
            data = path.read_bytes()
            members, end = gzip_members(data)
            if end < len(data):
                tail = path.with_name(path.name + f".cut-{int(time.time())}")
                tail.write_bytes(data[end:])
                with path.open("r+b") as f:
                    f.truncate(end)
                log.warning("%s: %d trailing byte(s) were not a complete gzip member (a stopped run); moved "
                            "them to %s, and the debate is redone", path, len(data) - end, tail)
            for k, body in enumerate(members):
                for line in body.decode("utf-8").splitlines():
                    if line.strip():
                        try:
                            self.records.append(json.loads(line))
                        except ValueError as e:
                            raise ValueError(f"{path} member {k}: not JSON ({e})") from None

    def append(self, record: dict) -> None:
        blob = gzip.compress((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"), mtime=0)
        with self._lock, self.path.open("ab") as f:
            f.write(blob)
            f.flush()
            self.records.append(record)


# ---------------------------------------------------------------- the run directory
class CorpusRunDir:
    def __init__(self, root: Path, settings: CorpusSettings):
        self.root = open_run_dir(root, settings, "use the stored settings to continue, or another --out")
        self.corpus = CorpusFile(root / CORPUS_FILE)

    def done(self, kind: str) -> set[str]:
        """Debate ids of this kind already in the corpus (a question's repeats have distinct ids)."""
        return {r["trace"]["debate_id"] for r in self.corpus.records if r["kind"] == kind}


def split_questions(s: CorpusSettings, n_logging: int, n_mad: int) -> dict[str, list[Question]]:
    """Disjoint, prefix-stable question sets: even / odd positions of one seeded permutation of the split."""
    pool = tasks.load(s.task, split=s.split)
    perm = subset(pool, len(pool), s.data_seed)
    sets = {"logging": perm[0::2], "mad": perm[1::2]}
    for kind, n in (("logging", n_logging), ("mad", n_mad)):
        if n > len(sets[kind]):
            raise ValueError(f"--n-{kind} {n} exceeds the {len(sets[kind])} questions available "
                             f"for {kind} debates in {s.task}/{s.split}")
    return {"logging": sets["logging"][:n_logging], "mad": sets["mad"][:n_mad]}


def repeat_seed(q: Question, k: int) -> int:
    """Debate seed of the k-th debate of question q: repeat 0 is the engine's default seed (the corpus's first
    debates), later repeats derive distinct seeds from it."""
    return default_debate_seed(q) if k == 0 else derive_seed(default_debate_seed(q), k)


def planned(questions: Sequence[Question], repeats: int) -> list[tuple[Question, int]]:
    """(question, debate seed) of every debate: repeat 0 of all questions first, then repeat 1, ... (a stop
    while growing keeps whole repeats of the earlier questions)."""
    return [(q, repeat_seed(q, k)) for k in range(repeats) for q in questions]


def collect(run: CorpusRunDir, s: CorpusSettings, backend: Backend | Mapping[str, Backend], n_logging: int,
            n_mad: int, max_in_flight: int, repeats: int = 1) -> None:
    """Missing debates: `repeats` logging debates per logging question (distinct seeds), one MAD per MAD question.
    `backend`: one for every agent, or with agent profiles on several backends a mapping spec -> backend."""
    cfg = DebateConfig(n_agents=s.n_agents, n_rounds=s.n_rounds, max_tokens=s.max_tokens, seed=s.seed,
                       layout=s.layout, temperature0=s.temperature0, top_p0=s.top_p0, agent_profiles=s.profiles())
    engine = DebateEngine(backend, cfg)
    policy = LoggingPolicy(s.n_agents, s.n_rounds, s.mask_p, s.temperature_range, s.top_p_range, s.seed)
    protocols = {"logging": policy, "mad": MADProtocol(s.n_agents, s.n_rounds, s.mad_temperature, s.mad_top_p)}
    for kind, questions in split_questions(s, n_logging, n_mad).items():
        done = run.done(kind)
        plan = planned(questions, repeats if kind == "logging" else 1)
        todo = [(q, seed) for q, seed in plan if debate_id_of(q, seed) not in done]
        if todo:
            _collect_kind(run, s, engine, kind, protocols[kind], todo, max_in_flight)


def _collect_kind(run: CorpusRunDir, s: CorpusSettings, engine: DebateEngine, kind: str, protocol,
                  todo: Sequence[tuple[Question, int]], max_in_flight: int) -> None:
    """Run one kind's missing debates concurrently, appending each to the corpus as soon as it finishes."""
    t0 = time.perf_counter()
    counter = {"n": 0, "failed": 0}
    progress = LiveProgress(len(todo), kind, unit="debate", tokens=GENERATED_TOKENS.total)

    def on_done(d: Debate) -> None:
        progress.update(1)
        if d.failed:  # not recorded: the same command redoes it
            counter["failed"] += 1
            log.error("%s debate %s failed (%s); not recorded", kind, d.debate_id, d.error)
            return
        policy_doc = (protocol.describe(d.debate_id) if kind == "logging" else
                      {"temperature": s.mad_temperature, "top_p": s.mad_top_p, "mask": "full"})
        run.corpus.append({"kind": kind, "layout": s.layout, "policy": policy_doc, "written_at": _utc_now(),
                           "trace": d.trace.to_dict()})
        counter["n"] += 1
        log.info("%s %d/%d %s (%.0f s)", kind, counter["n"], len(todo), d.debate_id, time.perf_counter() - t0)

    with progress:
        engine.run_concurrent([q for q, _ in todo], protocol, max_in_flight, debate_seeds=[seed for _, seed in todo],
                              on_done=on_done)
    print(f"{kind}: {counter['n']} debate(s) added, {counter['failed']} failed, {time.perf_counter() - t0:.0f} s",
          flush=True)


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- PROVENANCE.md
def _licence(task: str) -> str:
    path = Path(tasks.__file__).parent / "data" / task / "PROVENANCE.md"
    if not path.exists():
        return f"see the `{task}` task's definition (no dear/tasks/data/{task}/PROVENANCE.md)"
    m = re.search(r"^-?\s*Licen[cs]e:\s*(.+)$", path.read_text(encoding="utf-8"), re.M | re.I)
    src = f"dear/tasks/data/{task}/PROVENANCE.md"
    return f"{m.group(1).strip()} (from `{src}`)" if m else f"see `{src}`"


def model_file_info(llm: str) -> dict[str, str]:
    """Which model file a backend spec loads and its sha256 (the embedded model's is checked at assembly)."""
    if is_synthetic(llm):
        return {"file": "none (synthetic debaters, dear/sim/)", "sha256": "-"}
    file = model_file(llm)
    if file:
        return {"file": file[0], "sha256": file[1]}
    return {"file": f"served by `{llm}`", "sha256": "unknown (remote)"}


def write_provenance(run: CorpusRunDir, s: CorpusSettings, command: str) -> str:
    recs = run.corpus.records
    counts = {k: sum(r["kind"] == k for r in recs) for k in KINDS}
    questions = {k: len({r["trace"]["question_id"] for r in recs if r["kind"] == k}) for k in KINDS}
    model = model_file_info(s.llm)
    dates = sorted({r.get("written_at", "") for r in recs} - {""})
    synthetic = is_synthetic(s.llm)
    lines = [
        "# Debate corpus" + (" (SYNTHETIC: sim backend, not a real model)" if synthetic else ""),
        "",
        f"Command (continue or grow it with the same flags and larger --n-* or --repeats): `{command}`",
        "",
        f"- Backend: `{s.llm}`; model file `{model['file']}`, sha256 `{model['sha256']}`.",
        f"- Questions: `{s.task}` split `{s.split}`, permutation seed (--data-seed) {s.data_seed}; logging debates "
        "on even positions, MAD on odd positions (disjoint).",
        f"- Licence of the source questions: {_licence(s.task)}.",
        f"- Debates: {counts['logging']} logging-policy on {questions['logging']} questions (`--repeats` gives a "
        f"question several), {counts['mad']} MAD on {questions['mad']}; V = {s.n_agents}, R = {s.n_rounds} "
        f"exchange rounds, {s.max_tokens} max completion tokens, exchange layout `{s.layout}`, engine seed "
        f"{s.seed}, round 0 at T {s.temperature0}, top-p {s.top_p0}.",
        f"- Logging policy: pair bits Bernoulli({s.mask_p}), temperature ~ U{tuple(s.temperature_range)}, top-p ~ "
        f"U{tuple(s.top_p_range)}, independent per agent and round, RNG seeded by (seed {s.seed}, crc32(debate "
        "id), round); per-record log-probabilities in `policy.rounds`.",
        f"- MAD reference: full mesh, T {s.mad_temperature}, top-p {s.mad_top_p}.",
        *([f"- Agent profiles (agent 0, 1, ...): {', '.join(f'`{p}`' for p in s.agent_profiles)}; each turn of the "
           "traces records its agent's profile."] if s.agent_profiles else []),
        f"- Collected (UTC): {dates[0] if dates else '-'} to {dates[-1] if dates else '-'}; "
        f"PROVENANCE written {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.",
        f"- Files: `{CORPUS_FILE}` (gzip members, one JSON record per debate: kind, layout, policy, full "
        "DebateTrace), `settings.json` (the settings guard). Read with `simworld.corpus.read_corpus(DIR)`.",
        "",
    ]
    text = "\n".join(lines)
    (run.root / "PROVENANCE.md").write_text(text, encoding="utf-8")
    return text


# ---------------------------------------------------------------- CLI
def _range(text: str) -> tuple[float, float]:
    parts = text.replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected 'LOW,HIGH', got {text!r}")
    return float(parts[0]), float(parts[1])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_question_args(p, split="train", data_seed=14)
    p.add_argument("--n-logging", type=int, default=96)
    p.add_argument("--n-mad", type=int, default=24)
    p.add_argument("--repeats", type=int, default=1,
                   help="logging debates per logging question, with distinct seeds (grows the text bank's "
                        "answer classes; default 1)")
    add_backend_args(p, max_tokens=384, parallel=6, n_ctx=3072, speculative=True,
                     speculative_note="a speed setting: not part of the guarded settings", agent_profiles=True)
    add_debate_args(p, n_agents=None, n_agents_note="default: one per --agent-profiles, else 3", layout=REQUIRED,
                    layout_note="recorded", seed_note="also the logging policy's draws")
    p.add_argument("--mask-p", type=float, default=0.5)
    p.add_argument("--temperature-range", type=_range, default=DEFAULT_TEMPERATURE_RANGE, metavar="LOW,HIGH")
    p.add_argument("--top-p-range", type=_range, default=DEFAULT_TOP_P_RANGE, metavar="LOW,HIGH")
    p.add_argument("--mad-temperature", type=float, default=0.7)
    p.add_argument("--mad-top-p", type=float, default=0.9)
    p.add_argument("--max-in-flight", type=int, help="debates at once (default: parallel // agents, >= 1)")
    add_output_args(p, out_help="corpus directory (created; continued if it exists)", out=REQUIRED, path=True,
                    verbose=True)
    return p.parse_args(argv)


def settings_from_args(a: argparse.Namespace) -> CorpusSettings:
    if a.agent_profiles and "," in a.llm:  # before the profiles take --llm as their backend
        raise ValueError("--llm must be one spec with --agent-profiles (the backend of profiles that name none)")
    profiles = on_backend(a.agent_profiles, a.llm) if a.agent_profiles else None
    a.n_agents = n_agents_of(profiles, a.n_agents) or 3
    require_at_least(a, 0, "n_logging", "n_mad")
    require_at_least(a, 1, "n_agents", "max_tokens", "parallel", "n_ctx", "repeats")
    if a.n_rounds < 1:
        raise ValueError("--n-rounds must be >= 1 (the corpus is about exchange rounds)")
    return CorpusSettings(**DebateRunSettings.shared_from_args(a), layout=a.layout, mask_p=a.mask_p,
                          temperature_range=tuple(a.temperature_range), top_p_range=tuple(a.top_p_range),
                          mad_temperature=a.mad_temperature, mad_top_p=a.mad_top_p, temperature0=0.7, top_p0=0.9,
                          agent_profiles=tuple(p.name for p in profiles) if profiles else None)


def _make_backends(s: CorpusSettings, a: argparse.Namespace) -> Backend | dict[str, Backend]:
    """The backend of every agent, or a mapping spec -> backend when the agent profiles name several."""
    specs = backend_specs(s.profiles()) if s.agent_profiles else [s.llm]
    built = {}
    for spec in specs:
        kw = options_for(spec, {"n_parallel": a.parallel, "n_ctx": a.n_ctx})
        if a.speculative:
            kw["speculative"] = a.speculative
        built[spec] = make_backend(spec, **kw)
    return built[specs[0]] if len(built) == 1 else built


def main(argv: Sequence[str] | None = None, backend: Backend | Mapping[str, Backend] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    s = settings_from_args(a)
    LoggingPolicy(s.n_agents, s.n_rounds, s.mask_p, s.temperature_range, s.top_p_range, s.seed)  # checks the flags
    run = CorpusRunDir(a.out, s)
    own = backend is None
    if own:
        backend = _make_backends(s, a)
    in_flight = a.max_in_flight or max(1, a.parallel // s.n_agents)
    try:
        collect(run, s, backend, a.n_logging, a.n_mad, in_flight, a.repeats)
    finally:
        if own:
            for b in ([backend] if isinstance(backend, Backend) else backend.values()):
                b.close()
        print(write_provenance(run, s, command_line(PROG, argv)))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
