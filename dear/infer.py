"""Inference-time DEAR debates with an exported policy (docs/DESIGN.md §10), on any backend (floor 3).

No trainer, Ray or gym: an exported artifact (`python -m dear.export RUN OUT`) plus a backend spec is all.

    python -m dear.infer --policy results/embedded-gsm8k-math500/policy --llm local \\
        --question "A pen costs $3 and a notebook twice that. What do 2 pens and 1 notebook cost?"
    python -m dear.infer --policy POLICY --llm openai:http://127.0.0.1:8000/v1#my-model \\
        --questions mine.jsonl --question-field problem --kind math --out traces.jsonl --html debates.html

    from dear.infer import RegulatedDebater
    with RegulatedDebater("POLICY", "local") as debater:
        result = debater.ask("What is 17 * 23?", kind="integer")
        print(result.answer, result.answers_per_round, result.controls)

With `--answer-field`, answers are graded and accuracy is printed; without it, gold is unknown and nothing is
graded. The policy chooses who reads whom and each agent's temperature/top-p from round 1 on; round 0 uses
the fixed `--temperature`/`--top-p` like training did. The text output shows, per round and agent, what the agent did: a round-0
sample, revise reading whom, keep (no call), a fresh sample, or not called (a round after the policy's stop), with
T and top-p only where a model call was made. `--html` draws the debates just run as one page
(dear/debate/picture.py, the picture `python -m dear.show` draws of a stored trace).

`--out traces.jsonl` also writes `traces.regulator.jsonl` (the policy's decisions) and `traces.run.json`: the
command and what a seed's texts depend on beside it (`Decoding`: whether every backend decoded repeatably, llama.cpp's
thread count and slots). The llama.cpp settings (one slot and repeatable decoding by default, else `--parallel` slots,
`--n-ctx`) reach every llama.cpp backend of the run: `--llm`'s and those agent profiles name.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dear import tasks
from dear.atomic import write_json
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.confidence import TOP_LOGPROBS
from dear.debate.cli_args import (OMIT, add_backend_args, add_debate_args, add_output_args, add_policy_args,
                                  repeatable_of)
from dear.debate import pot
from dear.debate.engine import Debate, DebateConfig, DebateEngine, pot_on_synthetic_error
from dear.debate.picture import turn_kind, write_html
from dear.debate.profiles import AgentProfile, backend_specs, names, on_backend
from dear.debate.trace import AgentTurn, DebateTrace, write_jsonl
from dear.evidence import make_encoder
from dear.export import SHIPPED_POLICY, ExportedPolicy, ExportError, choose_encoder, load_exported
from dear.integrity import check_output_file
from dear.llm import Backend, make_backend
from dear.llm.base import GENERATED_TOKENS, REPLAYED_TOKENS
from dear.llm.cache import CachedBackend
from dear.llm.registry import KINDS, is_synthetic, kind_of, uses_llama_cpp
from dear.progress import LiveProgress
from dear.regulator import CertaintyWeigher, RegulatedProtocol, RegulatorRecord, decisions_json
from dear.sandbox import DEFAULT_LIMITS, SandboxLimits
from dear.seeds import derive_seed
from dear.tasks import AnswerKind, Question

log = logging.getLogger(__name__)

PROG = "python -m dear.infer"
UNKNOWN_GOLD = ""  # Question.gold for inference questions: the engine does not grade them


@dataclass
class InferenceResult:
    """One regulated debate: the voted answer, how it got there and what it cost."""

    question_id: str
    question: str
    answer: str | None  # the plurality vote's normalised answer (None: nobody gave a parsable answer)
    tie: bool
    answers_per_round: list[list[str | None]]  # [round][agent] normalised answers
    controls: list[RegulatorRecord]  # the regulator's beliefs, mask and sampling before each exchange round
    prompt_tokens: int
    completion_tokens: int
    failed: bool
    error: str | None
    correct: bool | None  # None when the gold answer is unknown
    trace: DebateTrace = field(repr=False)


class RegulatedDebater:
    """Runs DEAR-regulated debates with an exported policy on one backend, or with `agent_profiles` (one per agent,
    dear/debate/profiles.py) on the backends they name, `llm` serving the profiles that name none (closes what it
    opened). `backend_options` go to `llm` when it is a spec; the llama.cpp backends the profiles name take
    `profile_options` (default: `backend_options`), the others nothing. Program-of-thought agents (style `pot`) run
    their programs under `sandbox_limits` and show them to peers with `show_programs` (DebateConfig); they need a
    real model (the synthetic backend is refused)."""

    def __init__(self, policy: str | Path | ExportedPolicy, llm: str | Backend, *, n_rounds: int | None = None,
                 max_tokens: int = 512, temperature: float = 0.7, top_p: float = 0.9, seed: int = 0,
                 encoder: str | None = None, cache: str | Path | None = None, allow_encoder_mismatch: bool = False,
                 agent_profiles: Sequence[AgentProfile] | None = None,
                 sandbox_limits: SandboxLimits = DEFAULT_LIMITS, show_programs: bool = True,
                 profile_options: Mapping[str, object] | None = None, **backend_options):
        self.exported = policy if isinstance(policy, ExportedPolicy) else load_exported(policy)
        self._key = key = llm if isinstance(llm, str) else "llm"  # the profiles' name of `llm`
        profiles = on_backend(agent_profiles, key) if agent_profiles else None
        if profiles and len(profiles) != self.exported.n_agents:
            raise ValueError(f"agent profiles list {len(profiles)} agents but the policy debates with "
                             f"V={self.exported.n_agents}")
        self.config = DebateConfig(n_agents=self.exported.n_agents,
                                   n_rounds=int(n_rounds if n_rounds is not None else self.exported.n_rounds or 2),
                                   temperature0=temperature, top_p0=top_p, max_tokens=max_tokens, seed=seed,
                                   silent=self.exported.silent, decision=self.exported.decision,
                                   vote_tau=self.exported.vote_tau,
                                   agent_profiles=profiles, sandbox_limits=sandbox_limits,
                                   show_programs=show_programs,
                                   # a policy that observes the agents' confidence (or votes by it) needs their
                                   # log-probabilities
                                   logprobs=TOP_LOGPROBS if self.exported.reads_confidence else None,
                                   start_width=self.exported.start_width,
                                   max_samples=self.exported.max_samples,
                                   fresh_per_round=self.exported.fresh_per_round)
        refuse_pot_on_sim(profiles, llm, key)  # before the encoder and the backends load
        # a policy with the profile feature checks the pool now, before a backend loads (RegulatedProtocol)
        RegulatedProtocol(policy=self.exported.policy, encoder=None, config=self.config)
        # The policy saw features from its own encoder; another one changes its inputs (only when asked for).
        self.encoder_spec = choose_encoder(self.exported.encoder, encoder, allow_encoder_mismatch)
        self.encoder = make_encoder(self.encoder_spec)
        self._owns_backend = not isinstance(llm, Backend)
        backend = make_backend(llm, **backend_options) if isinstance(llm, str) else llm
        self.backend = CachedBackend(backend, cache) if cache else backend
        # The other backends the profiles name: built here, always closed here
        options = backend_options if profile_options is None else profile_options
        self.extra_backends = {spec: _profile_backend(spec, cache, options)
                               for spec in backend_specs(profiles or ()) if spec != key}
        # the belief-weighted vote (a policy trained with it) weighs answers with the policy's own evidence
        self.weigher = CertaintyWeigher(self.encoder, self.exported.answer_aware)
        self.engine = DebateEngine(self.backends(self.backend), self.config, weigher=self.weigher)
        if self.transfer:
            log.warning("policy %s was trained on the synthetic debater backend (sim-to-real transfer)",
                        self.exported.path)

    @property
    def transfer(self) -> bool:
        """A policy trained on the synthetic backend debating on a real one (on the sim itself there is none)."""
        return self.exported.synthetic and not self.backend.synthetic

    def backends(self, main: Backend) -> Backend | dict[str, Backend]:
        """What an engine of this debater's agents runs on, `main` standing in for `llm` (dear.serve passes its
        shared batch): `main` alone, or with profiles on other backends a mapping by the profiles' backend."""
        return {self._key: main, **self.extra_backends} if self.extra_backends else main

    def protocol(self) -> RegulatedProtocol:
        """A fresh regulated protocol with this debater's policy, encoder and config (records per debate id)."""
        return RegulatedProtocol(policy=self.exported.policy, encoder=self.encoder, config=self.config,
                                 deterministic=True, name="dear", answer_aware=self.exported.answer_aware)

    def run(self, questions: Sequence[Question], on_round=None) -> list[InferenceResult]:
        """Debate all questions together (each round is one batched backend call)."""
        if not questions:
            raise ValueError("RegulatedDebater.run: no questions given")
        protocol = self.protocol()
        debates = self.engine.run(questions, protocol, on_round=on_round)
        return [inference_result(d, protocol.records.get(d.debate_id, [])) for d in debates]

    def ask(self, question: str, kind: AnswerKind = "numeric", choices: Sequence[str] | None = None,
            gold: str = UNKNOWN_GOLD) -> InferenceResult:
        """One question as text; `kind` sets the answer format the agents are asked for and how it is parsed."""
        return self.run([make_question(question, kind, choices, gold)])[0]

    def close(self) -> None:
        if self._owns_backend:
            self.backend.close()
        for b in self.extra_backends.values():
            b.close()

    def __enter__(self) -> RegulatedDebater:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ORDER_SALT = 0x57A7E  # a bank replay's debate seeds: derive_seed(seed, debate index, ORDER_SALT)


@dataclass(frozen=True)
class BankDebates:
    """A policy's debates over banked questions, `orders` a question (each debate another seeded order of the
    question's samples), and the regulator's decisions in each (by debate id)."""

    questions: tuple[Question, ...]
    orders: int
    debates: tuple[Debate, ...]
    records: Mapping[str, list[RegulatorRecord]]

    def scores_by_question(self) -> dict[str, list[float]]:
        """Each question's final scores over its debates (a failed debate scores 0; a tie its expected value)."""
        out: dict[str, list[float]] = {q.id: [] for q in self.questions}
        for d in self.debates:
            out[d.question.id].append(0.0 if d.failed else float(d.trace.final_score or 0.0))
        return out


def debate_bank_orders(policy: str | Path | ExportedPolicy, backend: Backend, questions: Sequence[Question], *,
                       orders: int, max_tokens: int, seed: int = 0,
                       wrap: Callable[[RegulatedProtocol], Any] | None = None,
                       agent_profiles: Sequence[AgentProfile] | None = None) -> BankDebates:
    """Debate every question `orders` times with the policy on `backend` (a bank world: `dear.bank.backend`), one
    batched engine run; debate i gets the seed derive_seed(seed, i, ORDER_SALT), so the bank serves it its own order.
    `wrap` may put another protocol around the policy's (a random control that sets its rates each round);
    `agent_profiles`: a pool that mixes reply modes (the bank serves each agent its style's samples). Nothing here
    calls a model unless the backend does."""
    if not questions or orders < 1:
        raise ValueError(f"debate_bank_orders: need questions and orders >= 1 (got {len(questions)}, {orders})")
    with RegulatedDebater(policy, backend, max_tokens=max_tokens, seed=seed, agent_profiles=agent_profiles) as debater:
        protocol = debater.protocol() if wrap is None else wrap(debater.protocol())
        asked = [q for q in questions for _ in range(orders)]
        seeds = [derive_seed(seed, i, ORDER_SALT) for i in range(len(asked))]
        debates = debater.engine.run(asked, protocol, debate_seeds=seeds)
    return BankDebates(tuple(questions), orders, tuple(debates), dict(protocol.records))


def refuse_pot_on_sim(profiles: Sequence[AgentProfile] | None, llm: str | Backend, key: str) -> None:
    """ValueError when a `pot` profile runs on the synthetic backend (`sim`), whose debaters write no programs (the
    engine refuses it too, once the backends are built). `profiles` name their backends (`on_backend`), `key` being
    `llm`'s name."""
    for i, p in enumerate(profiles or ()):
        if p.style != pot.STYLE:
            continue
        if p.backend == key and not isinstance(llm, str):
            synthetic, name = llm.synthetic, llm.model_id
        else:
            synthetic, name = is_synthetic(p.backend or ""), p.backend
        if synthetic:
            raise ValueError(pot_on_synthetic_error(i, p.name, name))


def _profile_backend(spec: str, cache: str | Path | None, options: Mapping[str, object]) -> Backend:
    """A backend an agent profile names; the llama.cpp options (n_parallel, n_ctx) only for llama.cpp kinds."""
    backend = make_backend(spec, **(dict(options) if uses_llama_cpp(spec) else {}))
    return CachedBackend(backend, cache) if cache else backend


def inference_result(debate: Debate, controls: list[RegulatorRecord]) -> InferenceResult:
    """A finished debate and the regulator's decisions in it as an InferenceResult."""
    q, tr = debate.question, debate.trace
    return InferenceResult(
        question_id=q.id, question=q.question, answer=tr.final_answer, tie=tr.tie,
        answers_per_round=tr.answer_keys(), controls=controls, prompt_tokens=tr.prompt_tokens,
        completion_tokens=tr.completion_tokens, failed=tr.failed, error=tr.error,
        correct=None if q.gold == UNKNOWN_GOLD else bool(tr.final_correct), trace=tr)


def make_question(text: str, kind: AnswerKind = "numeric", choices: Sequence[str] | None = None,
                  gold: str = UNKNOWN_GOLD, qid: str = "q0") -> Question:
    if kind not in tasks.KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(tasks.KINDS)}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("question must be a non-empty string")
    if kind == "choice" and not choices:
        raise ValueError("kind 'choice' needs the option texts (choices)")
    return Question(id=qid, task="user", question=text.strip(), gold=gold, kind=kind,
                    choices=tuple(choices) if choices else None)


def describe_turn(turn: AgentTurn) -> str:
    """What one agent did in one round, as `dear.infer` prints it: its turn kind (round-0 sample, revise reading
    whom, keep, fresh sample), T and top-p only where a model call was made, and the answer it ended with."""
    kind = turn_kind(turn)
    answer = "no answer" if turn.answer_key is None else turn.answer_key
    if kind == "keep":  # no call: the sampling the policy set was never used
        return f"agent {turn.agent}: keep (no call) -> {answer}"
    if kind == "waiting":
        return f"agent {turn.agent}: waiting (not answered yet, no call)"
    what = {"sample": "sample", "fresh": "fresh sample"}.get(kind)
    if what is None:
        read = ", ".join(str(j) for j in turn.peers)
        what = f"revise reading {'agent' if len(turn.peers) == 1 else 'agents'} {read}" if turn.peers \
            else "revise reading nobody"
    result = f"FAILED {turn.error}" if turn.error else answer
    return f"agent {turn.agent}: {what}, T {turn.temperature:.2f}, top-p {turn.top_p:.2f} -> {result}"


def describe_rounds(result: InferenceResult, n_rounds: int) -> list[str]:
    """Per round its answers and, per agent, what the agent did (`describe_turn`); a round the debate did not run
    (the policy stopped it, or a failure ended it) says that no agent was called."""
    lines = []
    for rnd, turns in enumerate(result.trace.rounds):
        keys = [t.answer_key for t in turns]
        lines.append(f"  round {rnd}: answers {['-' if k is None else k for k in keys]}")
        lines += [f"    {describe_turn(t)}" for t in turns]
    ran = len(result.trace.rounds) - 1
    why = "a failed call ended the debate" if result.failed else f"the policy stopped the debate after round {ran}"
    lines += [f"  round {rnd}: not called ({why})" for rnd in range(ran + 1, n_rounds + 1)]
    return lines


@dataclass(frozen=True)
class Decoding:
    """What the texts of a seed depend on beside the command: recorded with `--out`'s traces (`write_run_record`)."""

    repeatable: bool  # every backend gives a seed the same texts (llama.cpp: one request at a time; sim, bank: anyway)
    llama_threads: int | None  # llama.cpp's thread count (None: no llama.cpp backend)
    n_parallel: int | None  # llama.cpp's parallel slots (None: no llama.cpp backend)


def llama_options(repeatable: bool, parallel: int | None, n_ctx: int | None, turns: int) -> dict[str, object]:
    """The options of the run's llama.cpp backends: one slot decoding repeatably, else `parallel` slots (default one
    per agent turn of the batch, `turns`, at most 16), and `n_ctx` when given."""
    options: dict[str, object] = {"n_parallel": 1 if repeatable else parallel or max(1, min(16, turns))}
    if repeatable:
        options["repeatable"] = True
    if n_ctx:
        options["n_ctx"] = n_ctx
    return options


def decoding_of(specs: Sequence[str], llama: Mapping[str, object]) -> Decoding:
    """How the backends `specs` decode with the llama.cpp options `llama`. The thread count is the one every llama.cpp
    backend chooses when it starts (`dear.llm.local.choose_threads`: DEAR_LLAMA_THREADS, else every usable core,
    never the machine's load)."""
    if not any(uses_llama_cpp(spec) for spec in specs):
        return Decoding(repeatable=all(KINDS[kind_of(spec)].repeatable for spec in specs), llama_threads=None,
                        n_parallel=None)
    from dear.llm.local import choose_threads

    repeats = all(bool(llama.get("repeatable")) if uses_llama_cpp(spec) else KINDS[kind_of(spec)].repeatable
                  for spec in specs)
    return Decoding(repeatable=repeats, llama_threads=choose_threads().threads, n_parallel=int(llama["n_parallel"]))


def write_run_record(out: Path, command: str, a: argparse.Namespace, decoding: Decoding) -> Path:
    """`<out stem>.run.json` beside the traces: the command, backend, seed and policy, and `decoding`; its path."""
    path = out.with_name(out.stem + ".run.json")
    profiles = names(on_backend(a.agent_profiles, a.llm)) if a.agent_profiles else None
    record = {"command": command, "llm": a.llm, "agent_profiles": profiles, "policy": str(a.policy), "seed": a.seed,
              **asdict(decoding)}
    write_json(path, record, indent=1)
    return path


def _load_questions(a: argparse.Namespace) -> list[Question]:
    if a.question:
        return [make_question(a.question, a.kind, a.choice or None)]
    if not Path(a.questions).exists():
        raise FileNotFoundError(f"--questions {a.questions}: no such file")
    if a.kind == "choice" and not a.choices_field:
        raise ValueError("--kind choice with --questions needs --choices-field")
    return tasks.load_jsonl(a.questions, a.question_field, a.answer_field, a.kind, choices_field=a.choices_field,
                            id_field=a.id_field)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_args(p, shipped=SHIPPED_POLICY)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--question", help="one question as text")
    src.add_argument("--questions", help="JSONL file, one question per line")
    p.add_argument("--kind", default="numeric", choices=tasks.KINDS, help="answer format (default numeric)")
    p.add_argument("--choice", action="append", help="an option text for --kind choice (repeat, in order)")
    p.add_argument("--question-field", default="question")
    p.add_argument("--answer-field", help="gold answers in the JSONL: grade and print accuracy")
    p.add_argument("--choices-field", help="options field for --kind choice in the JSONL")
    p.add_argument("--id-field", help="question id field in the JSONL (default: line number)")
    backend = add_backend_args(p, parallel_note="default: questions x agents, at most 16 (1 with --repeatable)",
                               agent_profiles=True, repeatable=None,
                               repeatable_note="default: on (a few debates cost little), unless --parallel > 1")
    backend.add_argument("--cache", help="SQLite response cache (repeated runs reuse completions)")
    add_debate_args(p, n_agents=OMIT, n_rounds=None, n_rounds_note="default: the policy's training setting",
                    sampling=True, sampling_note="round 0 (the policy sets the later rounds)")
    output = add_output_args(p, out_help="write per-debate JSONL traces (with the regulator's decisions) here",
                             verbose=True)
    output.add_argument("--html", help="write a picture of the debates here (one self-contained HTML page, as "
                                       "python -m dear.show draws a stored trace)")
    a = p.parse_args(argv)
    if a.choice and a.kind != "choice":
        p.error("--choice needs --kind choice")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    for flag, path in (("--out", a.out), ("--html", a.html)):
        if path:
            check_output_file(path, flag)  # before any debate runs, not after
    questions = _load_questions(a)
    try:
        exported = load_exported(a.policy)
    except ExportError as e:
        raise ExportError(f"--policy: {e}") from e
    specs = backend_specs(on_backend(a.agent_profiles, a.llm)) if a.agent_profiles else [a.llm]
    repeatable = repeatable_of(a.repeatable, specs, a.parallel)
    llama = (llama_options(repeatable, a.parallel, a.n_ctx, len(questions) * exported.n_agents)
             if any(uses_llama_cpp(spec) for spec in specs) else {})
    decoding = decoding_of(specs, llama)
    t0 = time.perf_counter()
    with RegulatedDebater(exported, a.llm, n_rounds=a.n_rounds, max_tokens=a.max_tokens, temperature=a.temperature,
                          top_p=a.top_p, seed=a.seed, encoder=a.encoder, cache=a.cache,
                          allow_encoder_mismatch=a.allow_encoder_mismatch, agent_profiles=a.agent_profiles,
                          profile_options=llama, **(llama if uses_llama_cpp(a.llm) else {})) as debater:
        tag = " [policy trained on the SYNTHETIC backend: sim-to-real]" if debater.transfer else ""
        profiles = debater.config.agent_profiles
        print(f"{len(questions)} question(s), V={debater.config.n_agents}, rounds={debater.config.n_rounds}, "
              f"llm={a.llm}{tag}" + (f", agents {', '.join(p.name for p in profiles)}" if profiles else ""),
              flush=True)
        # The debates run in lockstep, so progress counts rounds; tokens and elapsed time move within a round.
        with LiveProgress(debater.config.n_rounds + 1, f"{len(questions)} debate(s)", unit="round",
                          tokens=GENERATED_TOKENS.total, replayed=REPLAYED_TOKENS.total) as progress:
            results = debater.run(questions, on_round=lambda r, debates: progress.update(1))
    wall = time.perf_counter() - t0
    for r in results:
        status = f"FAILED {r.error}" if r.failed else (
            "" if r.correct is None else ("correct" if r.correct else "wrong"))
        print(f"\n[{r.question_id}] answer: {r.answer}{' (tie)' if r.tie else ''} {status}".rstrip())
        for line in describe_rounds(r, debater.config.n_rounds):
            print(line)
        print(f"  tokens {r.prompt_tokens + r.completion_tokens} (prompt {r.prompt_tokens}, "
              f"completion {r.completion_tokens})")
    graded = [r for r in results if r.correct is not None]
    if graded:
        print(f"\naccuracy {sum(r.correct for r in graded) / len(graded):.3f} ({sum(r.correct for r in graded)}/"
              f"{len(graded)})")
    print(f"wall time {wall:.1f} s")
    if a.out:
        out = Path(a.out)
        n = write_jsonl([r.trace for r in results], out)
        decisions = out.with_name(out.stem + ".regulator.jsonl")  # same layout as eval.run's traces
        decisions.write_text("".join(decisions_json(r.trace.debate_id, r.question_id, r.controls) + "\n"
                                     for r in results), encoding="utf-8")
        settings = write_run_record(out, command_line(PROG, argv), a, decoding)
        print(f"traces: {n} -> {out} (regulator decisions -> {decisions}, settings -> {settings})")
    if a.html:
        page = write_html([r.trace for r in results], a.html, command=command_line(PROG, argv))
        print(f"picture -> {page}")
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    run_cli(main, PROG)
