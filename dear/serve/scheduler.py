"""Continuous batching of DEAR-regulated debates for the server: one thread owns the debater and the engine.

Requests wait in a bounded queue. Between two engine steps the scheduler admits waiting requests (up to
`max_active` debates in flight), and one `DebateEngine.advance` call runs round 0 of the newly admitted debates
together with the next exchange round of every debate already running: requests that overlap in time share
one batched backend call per round (llama.cpp slots, vLLM continuous batching, concurrent HTTP). When the
scheduler is idle, the first request waits `batch_window_s` for others to arrive with it.

Each request names its method (`dear.serve.methods`: DEAR or a baseline); every method has its own engine
and protocol, and one step advances the debates of all of them together (`SharedBatch`: one backend call).

Budgets: a job may cap its debate's exchange rounds (`max_rounds`) and its completion tokens over all agents
and rounds (`max_tokens`). Before each exchange round, a debate stops and votes over what it has when the
round would exceed a cap: round `max_rounds` + 1, or the tokens spent so far plus the round's worst case
(every agent's call at its per-turn limit: its profile's, else `--max-tokens`) over `max_tokens`. So a
debate never spends more than its token budget, provided round 0's worst case fits it (`check_budget`). A
debate its protocol ends anyway (MAD-stop's unanimity) is not counted as stopped.

Each job hears about its debate through `notify(event)`, called from the scheduler thread: a `RoundDone`
per finished round, then `DebateDone` (also for a debate that failed because the backend returned errors)
or `DebateFailed` (the debate could not run at all: backend unavailable, internal error, shutdown).

`check_context` refuses, before it is queued, a question whose debate cannot fit an agent's backend context:
its round-0 prompt plus one turn's token budget, or the shortest prompt its last round can have (the
multi-turn layout repeats the question in every round). A request that fails anyway for its own sake (a
backend's context error) is not a failure of the backend: it does not make the server unavailable.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Literal

from dear.debate import prompts
from dear.debate.engine import (
    MIN_MAX_TOKENS,
    MSG_OVERHEAD_TOKENS,
    Debate,
    DebateConfig,
    DebateEngine,
    RoundControl,
    default_debate_seed,
)
from dear.debate.trace import AgentTurn
from dear.infer import InferenceResult, RegulatedDebater, inference_result
from dear.llm.base import Backend, BackendError, ChatMessage
from dear.regulator import RegulatorRecord
from dear.serve.batching import SharedBatch
from dear.serve.methods import DEAR, ServedMethod, build_methods
from dear.tasks.types import Question

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """More requests are waiting than `max_queue` allows (HTTP 429)."""


class Unavailable(RuntimeError):
    """The backend cannot be used right now (HTTP 503); the message says why."""


class BudgetTooSmall(ValueError):
    """A token budget below what round 0 may take (HTTP 400 naming the budget field)."""


class ContextTooLong(ValueError):
    """A debate of the question cannot fit the backend's context (HTTP 400 context_length_exceeded)."""

    def __init__(self, message: str, prompt_tokens: int, context_length: int):
        super().__init__(message)
        self.prompt_tokens, self.context_length = prompt_tokens, context_length


# What backends say when a request does not fit their context: llama.cpp ("request (N tokens) exceeds the
# available context size"), vLLM ("maximum context length", "longer than the maximum model length"), OpenAI
# (code context_length_exceeded), SGLang ("longer than the model's context length").
_CONTEXT_ERROR = re.compile(r"context[ _-]?(size|length|window)|maximum model length|max_model_len", re.I)


def is_context_error(error: str | None) -> bool:
    """The backend refused a request because it does not fit its context: the request's fault, not the
    backend's (it serves other requests fine)."""
    return bool(error) and _CONTEXT_ERROR.search(error) is not None  # type: ignore[arg-type]


@dataclass
class RoundDone:
    round: int
    turns: list[AgentTurn]
    control: RegulatorRecord | None  # the regulator's decision that drove this round (None for round 0)


Stopped = Literal["token_budget", "round_budget"]


@dataclass
class DebateDone:
    result: InferenceResult  # result.failed: the backend returned errors (the server answers 503)
    queued_s: float  # from submission to the debate's round 0
    debate_s: float  # from round 0 to the vote
    stopped: Stopped | None = None  # the budget that ended the debate before its planned rounds


@dataclass
class DebateFailed:
    reason: str
    status: int  # 503 backend unavailable / shutting down, 500 internal error


Event = RoundDone | DebateDone | DebateFailed


@dataclass(eq=False)
class DebateJob:
    """One request's debate: its question, its seed (None: derived from the question), its listener, the
    method that runs it and its budgets (None: no cap)."""

    question: Question
    seed: int | None
    notify: Callable[[Event], None]
    method: str = DEAR
    max_tokens: int | None = None  # completion tokens over all agents and rounds
    max_rounds: int | None = None  # exchange rounds after round 0
    cancelled: bool = False  # set by the server when the client went away: the debate is dropped
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None


@dataclass
class _Running:
    debate: Debate
    job: DebateJob
    method: ServedMethod
    reported_round: int = -1  # the last round told to the job
    stopped: Stopped | None = None


@dataclass
class _EngineStep:
    """What one engine advances in a step: round 0 of `new` debates, the next round of `active` ones."""

    engine: DebateEngine
    new: list[Debate] = field(default_factory=list)
    active: list[Debate] = field(default_factory=list)
    controls: list[RoundControl] = field(default_factory=list)


@dataclass
class SchedulerStats:
    """What the scheduler did since start (GET /health shows it)."""

    steps: int = 0  # scheduler steps (each advances every method's engine, in one batched backend call)
    backend_calls: int = 0  # generate calls to the backend (at most one per step)
    max_engines_per_step: int = 0  # engines (methods with different debate shapes) advanced in one step
    debate_rounds: int = 0  # summed over steps: debates advanced (mean batch = debate_rounds / steps)
    max_debates_per_step: int = 0
    debates_started: int = 0
    debates_finished: int = 0
    debates_failed: int = 0
    debates_cancelled: int = 0
    # Set when every request of the last step failed (requests refused for not fitting the context aside:
    # those are the request's fault); cleared by a step in which one succeeds.
    last_backend_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mean_debates_per_step"] = round(self.debate_rounds / self.steps, 2) if self.steps else 0.0
        return out


class DebateScheduler:
    """Runs every request's debate with the methods built on one RegulatedDebater (built by `build`), batching
    concurrent ones."""

    def __init__(self, build: Callable[[], RegulatedDebater], *, max_active: int = 32, max_queue: int = 256,
                 batch_window_s: float = 0.01, retry_s: float = 5.0):
        if max_active < 1 or max_queue < 1:
            raise ValueError(f"max_active and max_queue must be >= 1, got {max_active}, {max_queue}")
        self._build = build
        self.max_active, self.max_queue = max_active, max_queue
        self.batch_window_s, self.retry_s = batch_window_s, retry_s
        self.debater: RegulatedDebater | None = None
        self.unavailable: str | None = "not connected yet"
        self._last_attempt = -float("inf")
        self._batch: SharedBatch | None = None
        self.methods: Mapping[str, ServedMethod] = {}
        self._queue: deque[DebateJob] = deque()
        self._active: list[_Running] = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.stats = SchedulerStats()

    # ------------------------------------------------------------ lifecycle
    def connect(self) -> bool:
        """Build the debater (loads the policy, the encoder and the backend). A BackendError (server down,
        no CUDA...) leaves the scheduler unavailable, to be retried later; any other error propagates."""
        self._last_attempt = time.monotonic()
        try:
            debater = self._build()
        except BackendError as e:
            self.unavailable = f"backend unavailable: {e}"
            log.warning("%s (retrying at the next request, at most every %.1f s)", self.unavailable, self.retry_s)
            return False
        self._batch = SharedBatch(debater.backend)
        self.methods = build_methods(debater, self._batch)
        self.debater, self.unavailable = debater, None
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="dear-scheduler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop after the current step; waiting and running debates get DebateFailed(503)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for job in [*self._queue, *(r.job for r in self._active)]:
            _tell(job, DebateFailed("server is shutting down", 503))
        self._queue.clear()
        self._active.clear()
        if self._batch is not None:
            self._batch.close()
        if self.debater is not None:
            self.debater.close()

    # ------------------------------------------------------------ requests
    @property
    def synthetic(self) -> bool:
        return bool(self.debater is not None and self.debater.backend.synthetic)

    def load(self) -> dict[str, int]:
        return {"queued": len(self._queue), "active": len(self._active), "max_active": self.max_active,
                "max_queue": self.max_queue}

    def check_budget(self, method: str, max_tokens: int | None) -> None:
        """Raise BudgetTooSmall when `max_tokens` is below round 0's worst case for `method` (every agent's
        call at its per-turn limit): round 0 always runs, so a smaller budget could not be kept. Not checked
        while the backend is not built."""
        m = self.methods.get(method)
        if m is None or max_tokens is None or max_tokens >= m.round_worst_case:
            return
        limits = m.turn_limits
        if m.agent_profiles is None:
            calls = (f"{m.n_agents} agent call(s) of up to {limits[0]} completion tokens each (the server's "
                     f"--max-tokens)")
        else:  # the limits may differ by agent
            calls = (f"agent calls of up to {' + '.join(map(str, limits))} completion tokens (the agent profiles' "
                     f"limits, else the server's --max-tokens)")
        raise BudgetTooSmall(f"a token budget of {max_tokens} is below what round 0 of {method!r} may take: "
                             f"{calls} = {m.round_worst_case}; ask for at least {m.round_worst_case}")

    def check_context(self, question: Question, method: str = DEAR, max_rounds: int | None = None) -> None:
        """Raise ContextTooLong when a debate of `question` by `method`, of at most `max_rounds` exchange
        rounds, cannot fit an agent's backend context: round 0's prompt plus the agent's turn limit (round 0 is
        sent as is), or the shortest prompt the last exchange round can have (every agent reading every peer,
        every earlier answer empty) plus the engine's smallest answer budget (later rounds cut answers and
        shrink max_tokens to fit, but keep every copy of the question). Each agent is checked in its reply
        style, limit and backend (its profile's); agents alike in all three, once.

        The backend's tokenizer is asked only for prompts that might not fit (llama.cpp: an HTTP call, so
        call this from a worker thread). No check while the backend is not built, for a backend that does not
        know its context length, or when its tokenizer fails: the backend then decides, as it did before."""
        served = self.methods.get(method)
        if self.debater is None or served is None:
            return
        last = served.n_rounds if served.exchanges else 0  # the last round whose prompt shows peers
        if max_rounds is not None:
            last = min(last, max_rounds)
        for agent in _unlike_agents(served):
            _check_agent_context(question, served, agent, last)

    def submit(self, job: DebateJob) -> None:
        """Queue a debate; raises Unavailable (backend down, no retry due yet) or QueueFull."""
        with self._cv:
            if self._closed:
                raise Unavailable("server is shutting down")
            if self.debater is None and time.monotonic() - self._last_attempt < self.retry_s:
                raise Unavailable(self.unavailable or "backend unavailable")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are already waiting (max_queue={self.max_queue}); "
                                f"retry later")
            self._queue.append(job)
            self._cv.notify_all()

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or self._queue or self._active)
                if self._closed:
                    return
                if not self._active:  # idle: let requests that arrive together share round 0
                    self._cv.wait_for(lambda: self._closed or len(self._queue) >= self.max_active,
                                      timeout=self.batch_window_s)
                    if self._closed:
                        return
                admitted = self._admit()
            if self.debater is None and not self.connect():
                for job in admitted:
                    _tell(job, DebateFailed(self.unavailable or "backend unavailable", 503))
                continue
            try:
                self._step(admitted)
            except Exception as e:  # a bug or an encoder/policy failure: fail these debates, keep serving
                log.exception("scheduler step failed")
                for job in [*admitted, *(r.job for r in self._active)]:
                    _tell(job, DebateFailed(f"internal error: {type(e).__name__}: {e}", 500))
                self._active.clear()
                for method in self.methods.values():
                    _records(method).clear()

    def _admit(self) -> list[DebateJob]:
        jobs = []
        while self._queue and len(self._active) + len(jobs) < self.max_active:
            job = self._queue.popleft()
            if not job.cancelled:
                jobs.append(job)
        return jobs

    def _step(self, admitted: list[DebateJob]) -> None:
        """One engine step for every method: round 0 of the admitted debates and the next round of the running
        ones, all engines' calls in one backend call."""
        assert self._batch is not None
        self._drop_cancelled()
        new = [self._create(job) for job in admitted]
        now = time.perf_counter()
        for job in admitted:
            job.started = now
        steps: dict[int, _EngineStep] = {}  # by id(engine): methods may share one

        def step_of(method: ServedMethod) -> _EngineStep:
            return steps.setdefault(id(method.engine), _EngineStep(method.engine))

        for r in new:
            step_of(r.method).new.append(r.debate)
        for method, running in self._by_method(self._active).items():
            step = step_of(method)
            step.active += [r.debate for r in running]
            step.controls += self._controls(method, running)
        calls = self._batch.calls
        self._batch.run_together([partial(s.engine.advance, s.new, s.active, s.controls) for s in steps.values()])
        self.stats.backend_calls += self._batch.calls - calls
        self.stats.max_engines_per_step = max(self.stats.max_engines_per_step, len(steps))
        self._active += new
        self._record_step(len(self._active))
        still = []
        for r in self._active:
            self._report(r)
            if not r.debate.done:
                still.append(r)
        self._active = still

    def _drop_cancelled(self) -> None:
        for r in [r for r in self._active if r.job.cancelled]:
            self._active.remove(r)
            _records(r.method).pop(r.debate.debate_id, None)
            self.stats.debates_cancelled += 1

    def _create(self, job: DebateJob) -> _Running:
        m = self.methods[job.method]
        seed = default_debate_seed(job.question) if job.seed is None else job.seed
        (debate,) = m.engine.create([job.question], [seed], n_rounds=m.n_rounds, protocol=m.protocol.name,
                                    decision=m.decision)
        return _Running(debate, job, m)

    @staticmethod
    def _by_method(runs: list[_Running]) -> dict[ServedMethod, list[_Running]]:
        groups: dict[ServedMethod, list[_Running]] = {}
        for r in runs:
            groups.setdefault(r.method, []).append(r)
        return groups

    def _controls(self, method: ServedMethod, runs: list[_Running]) -> list[RoundControl]:
        """The protocol's controls for the next round, turned into a stop where a budget ends the debate (the
        regulator's decision for a round that will not run is forgotten)."""
        controls = method.protocol.controls([r.debate for r in runs])
        for r, control in zip(runs, controls):
            if control.stop:
                continue
            r.stopped = _budget_stop(r)
            if r.stopped is not None:
                control.stop = True
                decisions = _records(method).get(r.debate.debate_id)
                if decisions and decisions[-1].round == r.debate.round + 1:
                    decisions.pop()
        return controls

    def _record_step(self, n_debates: int) -> None:
        s = self.stats
        s.steps += 1
        s.debate_rounds += n_debates
        s.max_debates_per_step = max(s.max_debates_per_step, n_debates)
        # A turn refused for not fitting the context is the request's fault, not a sign the backend is down:
        # only the other turns count, and a step with none of them leaves the last verdict as it was.
        turns = [t for r in self._active for t in r.debate.last_turns if not is_context_error(t.error)]
        if turns:
            errors = [t.error for t in turns if t.error is not None]
            s.last_backend_error = errors[0] if len(errors) == len(turns) else None

    def _report(self, r: _Running) -> None:
        """Tell the job about a round that ran this step (a debate that stopped ran none), and its end."""
        d, job = r.debate, r.job
        records = _records(r.method).get(d.debate_id, [])
        if r.reported_round < 0:
            self.stats.debates_started += 1
        if not d.failed and d.round > r.reported_round:
            control = records[-1] if d.round >= 1 and records else None
            _tell(job, RoundDone(d.round, d.last_turns, control))
            r.reported_round = d.round
        if d.done:
            _records(r.method).pop(d.debate_id, None)
            self.stats.debates_finished += not d.failed
            self.stats.debates_failed += d.failed
            started = job.started or job.submitted
            _tell(job, DebateDone(inference_result(d, records), queued_s=started - job.submitted,
                                  debate_s=time.perf_counter() - started, stopped=r.stopped))


def _records(method: ServedMethod) -> dict[str, list[RegulatorRecord]]:
    """The regulator's decisions per debate id (a baseline's protocol keeps none: a throwaway dict)."""
    return getattr(method.protocol, "records", {})


def _budget_stop(r: _Running) -> Stopped | None:
    """The budget the debate's next round would exceed: its round cap, or its tokens spent plus the round's
    worst case over its token budget."""
    job, d = r.job, r.debate
    if job.max_rounds is not None and d.round >= job.max_rounds:
        return "round_budget"
    if job.max_tokens is not None and d.trace.completion_tokens + r.method.round_worst_case > job.max_tokens:
        return "token_budget"
    return None


def _unlike_agents(m: ServedMethod) -> list[int]:
    """The first agent of each (backend, reply style, turn limit) of the method: the others' prompts fit alike."""
    first: dict[tuple[str, str, int], int] = {}
    for i in range(m.n_agents):
        first.setdefault((m.engine.agent_keys[i], m.config.profile(i).style, m.config.agent_max_tokens(i)), i)
    return list(first.values())


def _check_agent_context(question: Question, m: ServedMethod, agent: int, last: int) -> None:
    """check_context for one agent of method `m`, whose debate has `last` exchange rounds showing peers."""
    backend, cfg = m.engine.backends[m.engine.agent_keys[agent]], m.config
    ctx, style = backend.context_length, cfg.profile(agent).style
    if not ctx:
        return
    checks = [(prompts.round0_messages(question, cfg.system_prompt, style), cfg.agent_max_tokens(agent), 0)]
    if last >= 1:
        checks.append((_last_round_floor(question, cfg, last, style), MIN_MAX_TOKENS, last))
    # A (byte-level BPE) token covers at least one UTF-8 byte: short prompts fit without tokenizing.
    if all(sum(len(msg.content.encode()) + MSG_OVERHEAD_TOKENS for msg in messages) + budget <= ctx
           for messages, budget, _ in checks):
        return
    counted: dict[str, int] = {}  # the last round repeats the same texts
    for messages, budget, round_ in checks:
        try:
            n = _count(backend, messages, counted)
        except Exception:  # noqa: BLE001 - a tokenizer hiccup must not refuse the request
            log.warning("could not count the prompt's tokens; the backend will judge its length", exc_info=True)
            return
        if n + budget > ctx:
            raise ContextTooLong(_too_long_message(ctx, n, budget, round_, cfg, agent), n, ctx)


def _last_round_floor(question: Question, cfg: DebateConfig, n_rounds: int,
                      style: str = prompts.DEFAULT_STYLE) -> list[ChatMessage]:
    """The shortest prompt exchange round `n_rounds` can have for an agent of reply `style`: every agent reads
    all its peers in every round (the most copies of the question: the multi-turn layout repeats it with the
    peers' answers) and every earlier answer is empty (less than the engine ever cuts an answer to)."""
    def blank(agent: int) -> prompts.ShownAnswer:
        return prompts.ShownAnswer(agent=agent, reasoning="", conclusion="", answer=None)

    peers = tuple(blank(j) for j in range(1, cfg.n_agents))
    if cfg.layout == "single":
        return prompts.exchange_messages(question, blank(0), peers, system_prompt=cfg.system_prompt, style=style)
    exchanges = [prompts.Exchange(own_text="", own=blank(0), peers=peers)] * n_rounds
    return prompts.multiturn_messages(question, exchanges, system_prompt=cfg.system_prompt, style=style)


def _count(backend: Backend, messages: list[ChatMessage], counted: dict[str, int]) -> int:
    """Prompt tokens as the engine counts them (content tokens plus a chat-template allowance per message)."""
    for m in messages:
        if m.content not in counted:
            counted[m.content] = backend.count_tokens(m.content)
    return sum(counted[m.content] + MSG_OVERHEAD_TOKENS for m in messages)


def _too_long_message(ctx: int, n: int, budget: int, round_: int, cfg: DebateConfig, agent: int) -> str:
    profile = cfg.profile(agent)
    whose = "each agent's answer" if cfg.agent_profiles is None else \
        f"the answer of agent {agent} (profile {profile.name})"
    if round_ == 0:
        limit = "the server's --max-tokens" if profile.max_tokens is None else "its profile's limit"
        need = (f"round 0's prompt for this question takes {n} tokens and {whose} may take up to "
                f"{budget} more ({limit})")
    else:
        copies = (" (its prompt repeats the question with the peers' answers of every round)"
                  if cfg.layout == "multiturn" else "")
        need = (f"the prompt of the debate's last round, round {round_}{copies}, takes at least {n} tokens for "
                f"this question even with every earlier answer left out, and {whose} needs at "
                f"least {budget} more")
    return (f"This model's maximum context length is {ctx} tokens per agent turn, but {need}: {n + budget} in "
            f"all. Shorten the question (the last user message).")


def _tell(job: DebateJob, event: Event) -> None:
    try:
        job.notify(event)
    except Exception:  # the listener's event loop is gone (server stopping): nothing left to tell
        log.debug("could not deliver %s", type(event).__name__, exc_info=True)
