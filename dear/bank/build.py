"""Build or extend a sample bank with a live model: `python -m dear.bank build ...` (resumable).

The questions are the first `--n` of the benchmark split's seeded shuffle (`dear.tasks.load(name, split, n, seed)`,
the subsets `eval.run` takes, so a larger `--n` extends a smaller one), each sampled `--samples` times by one wide
round 0 of the debate engine at the shelf's setting, with its log-probabilities. Sample i has round-0 agent i's seed,
so the first samples of an evaluation's questions are the requests its round 0 and self-consistency sent. With
`--shared-prompt` sample i has sample 0's seed + i instead, and llama.cpp samples a question's samples from one
request that reads its prompt once (`n_cmpl`): faster where prompts are long beside the replies
(bench/bench_shared_prompt.py), but such questions cannot prime an evaluation's cache (dear/bank/prime.py refuses their seeds).

Stopping (Ctrl-C, SIGTERM) lets the questions in flight finish and be kept; the same command continues. A question
whose samples failed is not stored; the next run redoes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dear import tasks
from dear.bank.store import Bank, BankSample, Shelf, ShelfKey
from dear.confidence import TOP_LOGPROBS
from dear.debate.engine import Debate, DebateConfig, DebateEngine
from dear.debate.profiles import AgentProfile
from dear.debate.protocols import MajorityProtocol
from dear.llm.base import GENERATED_TOKENS, Backend
from dear.llm.registry import model_file
from dear.progress import LiveProgress

log = logging.getLogger("dear.bank")
DEFAULT_TOP_LOGPROBS = TOP_LOGPROBS  # alternatives per token (dear/confidence.py)


@dataclass(frozen=True)
class BuildPlan:
    """What one build adds: questions `n` of the split (seeded subset), `samples` per question, at `key`."""

    key: ShelfKey
    n: int
    samples: int
    subset_seed: int = 0
    engine_seed: int = 0
    top_logprobs: int = DEFAULT_TOP_LOGPROBS
    # sample i takes sample 0's seed + i, so llama.cpp reads each question's prompt once for all its samples
    # (DebateConfig.shared_prompt); False: round-0 agent i's own seed, the request an evaluation's round 0 sends
    shared_prompt: bool = False


def model_identity(llm: str) -> tuple[str, str]:
    """(file name, sha256) of the model a local/smoke spec loads; other backends are named by their spec."""
    return model_file(llm) or (llm, "unknown (" + llm + ")")


def sample_of(turn, question_id: str) -> BankSample:
    return BankSample(question_id=question_id, sample=turn.agent, seed=turn.seed, text=turn.text, answer=turn.answer,
                      answer_key=turn.answer_key, correct=bool(turn.correct), grader=turn.grader,
                      prompt_tokens=turn.prompt_tokens, completion_tokens=turn.completion_tokens,
                      finish_reason=turn.finish_reason, confidence=turn.confidence,
                      latency_s=round(float(turn.latency_s), 3), program=turn.program)


def todo_questions(shelf: Shelf, questions: Sequence[tasks.Question], samples: int) -> list[tasks.Question]:
    """The questions that have fewer than `samples` samples on the shelf. A question with some but not all samples
    is redone whole (its stored samples are kept; a redone sample at an index already stored is not stored again)."""
    return [q for q in questions if shelf.n_samples(q.id) < samples]


def build(bank: Bank, plan: BuildPlan, backend: Backend, max_in_flight: int = 1,
          generation: dict[str, Any] | None = None, progress: bool = True) -> int:
    """Sample the plan's questions that the shelf lacks; returns how many questions were added."""
    key = plan.key
    shelf = bank.shelf(key)
    questions = tasks.load(key.benchmark, split=key.split, n=plan.n, seed=plan.subset_seed)
    todo = todo_questions(shelf, questions, plan.samples)
    settings = {**(generation or {}), "engine_seed": plan.engine_seed, "subset_seed": plan.subset_seed,
                "top_logprobs": plan.top_logprobs, "backend": backend.model_id, "shared_prompt": plan.shared_prompt}
    if not todo:
        log.info("nothing to do: %d questions x %d samples are on %s", len(questions), plan.samples, key.name)
        if shelf.path.exists():
            bank.record(shelf, settings)
        return 0
    cfg = DebateConfig(n_agents=plan.samples, n_rounds=0, temperature0=key.temperature, top_p0=key.top_p,
                       max_tokens=key.max_tokens, seed=plan.engine_seed, logprobs=plan.top_logprobs,
                       shared_prompt=plan.shared_prompt,
                       agent_profiles=None if key.profile == "cot" else (AgentProfile(style=key.profile),))
    lock = threading.Lock()
    added = {"n": 0, "failed": 0}
    t0 = time.perf_counter()
    bar = LiveProgress(len(todo), f"bank {key.name}", unit="q", tokens=GENERATED_TOKENS.total, enabled=progress)

    def on_done(d: Debate) -> None:
        bar.update(1)
        if d.failed:
            added["failed"] += 1
            log.error("question %s failed (%s); not stored, the next run redoes it", d.question.id, d.error)
            return
        with lock:
            shelf.append([sample_of(t, d.question.id) for t in d.trace.rounds[0]])
            bank.record(shelf, settings)
            added["n"] += 1
        completion = sum(t.completion_tokens for t in d.trace.rounds[0])
        log.info("%d/%d %s: %d completion tokens (%.0f s since the start)", added["n"], len(todo), d.question.id,
                 completion, time.perf_counter() - t0)

    with bar:
        DebateEngine(backend, cfg).run_concurrent(todo, MajorityProtocol(), max_in_flight, on_done=on_done)
    print(f"bank {key.name}: {added['n']} question(s) added, {added['failed']} failed, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return added["n"]


def grower(bank: Bank, generation: dict[str, Any] | None = None):
    """A `BankBackend.grow` callback: grade a sample the live model drew beyond the stored ones and store it."""
    from dear.confidence import confidence_dict
    from dear.debate.engine import grade_turn

    by_id: dict[tuple[str, str], dict[str, tasks.Question]] = {}

    def grow(key: ShelfKey, question_id: str, index: int, request, c) -> None:
        questions = by_id.setdefault((key.benchmark, key.split),
                                     {q.id: q for q in tasks.load(key.benchmark, split=key.split)})
        q = questions[question_id]
        g = grade_turn(c.text, c.finish_reason, c.error, q, key.profile, program=c.program)
        shelf = bank.shelf(key)
        shelf.append([BankSample(question_id, index, int(request.seed), c.text,
                                 g.answer, g.key, g.correct, g.grader, c.prompt_tokens, c.completion_tokens,
                                 c.finish_reason, confidence_dict(c.logprobs, c.text, g.answer if g.program is None else None,
                                                                    "live: none sent"),
                                 round(float(c.latency_s), 3), program=g.program)])
        bank.record(shelf, {**(generation or {}), "grown_by": "bank world (live model)"})

    return grow
