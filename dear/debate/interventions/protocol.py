"""`InterventionProtocol`: any protocol with the interventions switched on. It drives the debates round by round:
the moderator rates the last round's answers before the next round, the judge rates each exchange round after it,
and a flagged round gets DRIFTPolicy's advice or is redone. `AgendaState` is seed 002's agenda stage machine."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dear.debate.engine import Debate, DebateEngine, RoundControl
from dear.debate.interventions.config import AGENDA_STAGES, STAGE_INSTRUCTIONS, InterventionConfig
from dear.debate.interventions.judging import SKIPPED_REASON, judge_verdict, needs_judge_call, round_outcome
from dear.debate.interventions.parsing import (
    Advice,
    JudgeVerdict,
    ModeratorRating,
    moderator_action,
    parse_advice,
    parse_rating,
)
from dear.debate.interventions.prompts import (
    ADVICE_PREFIX,
    _clip,
    intervention_request,
    judge_messages,
    moderator_messages,
    policy_messages,
)
from dear.debate.trace import ExtraCall
from dear.llm.base import Backend, ChatMessage, Completion

# The package's name: log lines keep the logger name they had when the package was one module.
log = logging.getLogger("dear.debate.interventions")


@dataclass
class AgendaState:
    """Seed 002's agenda: the stage of the next round; `record_round(conflict)` after each rated round."""

    quiet_to_advance: int = 2
    max_stage_rounds: int = 2
    index: int = 0
    rounds_in_stage: int = 0
    quiet_rounds: int = 0
    rounds_per_stage: dict[str, int] = field(default_factory=dict)

    @property
    def stage(self) -> str:
        return AGENDA_STAGES[self.index]

    @property
    def instruction(self) -> str:
        return STAGE_INSTRUCTIONS[self.stage]

    def record_round(self, new_conflict: bool) -> bool:
        """Count one finished round of the current stage; returns True when the stage advanced."""
        self.rounds_in_stage += 1
        self.rounds_per_stage[self.stage] = self.rounds_per_stage.get(self.stage, 0) + 1
        self.quiet_rounds = 0 if new_conflict else self.quiet_rounds + 1
        last = self.index == len(AGENDA_STAGES) - 1
        if not last and (self.quiet_rounds >= self.quiet_to_advance or self.rounds_in_stage >= self.max_stage_rounds):
            self.index += 1
            self.rounds_in_stage = self.quiet_rounds = 0
            return True
        return False


@dataclass
class _DebateState:
    agenda: AgendaState | None = None
    advice: str | None = None  # DRIFTPolicy advice for the next round
    ignored: set[int] = field(default_factory=set)  # agents whose last answer peers must not see
    control: RoundControl | None = None  # the control of the last round (for a redo)


class InterventionProtocol:
    """Any protocol (`n_rounds` + `controls(debates)`) with the configured interventions switched on.

    Use `run(engine, questions)` instead of `engine.run(questions, protocol)`: the interventions need the engine
    between rounds (extra calls, redoing a round). `backend` serves the judge, feedback and moderator calls;
    None = the backend of the engine's agent 0 (the debaters' own model, as in seed 000).
    """

    def __init__(self, protocol, config: InterventionConfig, backend: Backend | None = None,
                 name: str | None = None):
        if not config.any:
            raise ValueError("InterventionProtocol: no intervention switched on (judge or moderator)")
        self.protocol = protocol
        self.config = config
        self.backend = backend
        self.name = name or f"{getattr(protocol, 'name', type(protocol).__name__)}+{config.label()}"

    @property
    def n_rounds(self) -> int:
        return self.protocol.n_rounds

    @property
    def records(self):
        """The wrapped protocol's per-debate records (the DEAR regulator's decisions), if it keeps any."""
        return getattr(self.protocol, "records", None)

    # ------------------------------------------------------------ driving debates
    def run(self, engine: DebateEngine, questions, debate_seeds: Sequence[int] | None = None,
            on_round: Callable[[int, list[Debate]], None] | None = None) -> list[Debate]:
        """Whole debates under the wrapped protocol plus the interventions (same results shape as engine.run)."""
        debates = engine.start(questions, debate_seeds, n_rounds=self.n_rounds, protocol=self.name)
        if on_round:
            on_round(0, debates)
        return self.drive(engine, debates, on_round)

    def drive(self, engine: DebateEngine, debates: list[Debate],
              on_round: Callable[[int, list[Debate]], None] | None = None) -> list[Debate]:
        """The exchange rounds, with the interventions, of debates that have run round 0 (from `engine.start`
        or a stored round 0 via `engine.start_from_round0`)."""
        cfg = self.config
        backend = self.backend or engine.backends[engine.agent_keys[0]]
        states = {d.debate_id: _DebateState(
            agenda=AgendaState(cfg.agenda_quiet_rounds, cfg.agenda_max_stage_rounds) if cfg.agenda else None)
            for d in debates}
        r = 0
        while active := [d for d in debates if not d.done]:
            r += 1
            if cfg.moderator:
                self._moderate(engine, backend, active, states)
            controls = self._controls(active, states)
            for d, ctl in zip(active, controls):
                states[d.debate_id].control = ctl
            engine.step(active, controls)
            if cfg.judge:
                self._judge_round(engine, backend, [d for d in active if not d.failed], states)
            if on_round:
                on_round(r, debates)
        return debates

    def _controls(self, debates: list[Debate], states: dict[str, _DebateState]) -> list[RoundControl]:
        """The wrapped protocol's controls, minus ignored answers, plus advice and the agenda instruction."""
        out = []
        for d, ctl in zip(debates, self.protocol.controls(debates)):
            st = states[d.debate_id]
            mask = np.array(ctl.mask, dtype=bool)
            for j in st.ignored:
                mask[:, j] = False
            notes = [n for n in (st.advice, st.agenda.instruction if st.agenda else None) if n]
            guidance = ctl.guidance
            if notes:
                extra = "\n".join(notes)
                base = ctl.guidance or (None,) * ctl.n_agents
                guidance = tuple(f"{g}\n{extra}" if g else extra for g in base)
            out.append(RoundControl(mask, ctl.temperature.copy(), ctl.top_p.copy(), guidance))
            if st.agenda:
                d.trace.add_extra_call(ExtraCall("agenda", d.round + 1, 0, 0,
                                                 result={"stage": st.agenda.stage}))
            st.advice = None
        return out

    # ------------------------------------------------------------ extra calls
    def _call(self, engine: DebateEngine, backend: Backend, kind: str, jobs: list[tuple[Debate, int, int | None,
              list[ChatMessage]]], max_tokens: int, temperature: float) -> list[Completion]:
        """One batched generate call; a failing batch becomes error completions (the debates go on)."""
        reqs = [intervention_request(kind, msgs, engine.config.seed, d.trace, rnd, agent, temperature, max_tokens)
                for d, rnd, agent, msgs in jobs]
        if not reqs:
            return []
        try:
            comps = backend.generate(reqs)
            if len(comps) != len(reqs):
                raise RuntimeError(f"{len(comps)} completions for {len(reqs)} requests")
        except Exception as e:  # an intervention failure must not fail the debates
            log.exception("%s calls failed on a batch of %d", kind, len(reqs))
            comps = [Completion("", 0, 0, "error", 0.0, error=f"{type(e).__name__}: {e}") for _ in reqs]
        return comps

    def _judge_round(self, engine: DebateEngine, backend: Backend, debates: list[Debate],
                     states: dict[str, _DebateState]) -> None:
        cfg = self.config
        judged = [d for d in debates if d.round >= 1 and (cfg.judge_final_round or not d.done)
                  and d.last_turns[0].attempt == 0]
        todo = [d for d in judged if needs_judge_call(cfg.judge_prompt, d.trace.rounds[-2], d.last_turns)]
        jobs = [(d, d.round, None, judge_messages(d.question, d.trace.rounds[-2], d.last_turns,
                                             cfg.solution_chars, cfg.judge_prompt))
                for d in todo]
        comps = dict(zip((d.debate_id for d in todo),
                         self._call(engine, backend, "judge", jobs, cfg.judge_tokens, cfg.judge_temperature)))
        flagged = []
        for d in judged:
            prev, cur = d.trace.rounds[-2], d.last_turns
            c = comps.get(d.debate_id, Completion("", 0, 0, "skipped", 0.0))
            if d.debate_id not in comps:
                v = JudgeVerdict(False, SKIPPED_REASON)
            elif c.error is not None:
                v = JudgeVerdict(False, f"error: {c.error}", True)
            else:
                v = judge_verdict(cfg.judge_prompt, c.text, d.question, prev, cur)
            d.trace.add_extra_call(ExtraCall(
                "judge", d.round, c.prompt_tokens, c.completion_tokens, c.text or "",
                {"drifted": v.drifted, "malformed": v.malformed, "reason": v.reason,
                 "skipped": d.debate_id not in comps, "prev": round_outcome(prev), "cur": round_outcome(cur)},
                error=c.error))
            if v.drifted:
                flagged.append((d, v))
        if not flagged:
            return
        if cfg.regenerate:
            redo = [d for d, _ in flagged]
            engine.redo_last_round(redo, [self._hotter(states[d.debate_id].control) for d in redo])
        if cfg.policy:
            self._advise(engine, backend, [(d, v) for d, v in flagged if not d.done], states)

    def _hotter(self, ctl: RoundControl | None) -> RoundControl:
        if ctl is None:
            raise RuntimeError("regenerate: no control recorded for the round to redo")
        t = np.maximum(ctl.temperature, self.config.regenerate_temperature)
        return RoundControl(ctl.mask.copy(), t, ctl.top_p.copy(), ctl.guidance)

    def _advise(self, engine: DebateEngine, backend: Backend, flagged: list[tuple[Debate, JudgeVerdict]],
                states: dict[str, _DebateState]) -> None:
        cfg = self.config
        jobs = [(d, d.round, None, policy_messages(d, d.trace.rounds[-2], d.last_turns, v.reason, cfg.solution_chars))
                for d, v in flagged]
        comps = self._call(engine, backend, "policy", jobs, cfg.policy_max_tokens, cfg.judge_temperature)
        for (d, _), c in zip(flagged, comps):
            a = parse_advice(c.text) if c.error is None else Advice("", (), True)
            d.trace.add_extra_call(ExtraCall(
                "policy", d.round, c.prompt_tokens, c.completion_tokens, c.text or "",
                {"advice": a.text, "error_types": list(a.error_types), "malformed": a.malformed}, error=c.error))
            if not a.malformed:
                types = f"; error types: {', '.join(a.error_types)}" if a.error_types else ""
                states[d.debate_id].advice = ADVICE_PREFIX.format(types=types) + a.text

    def _moderate(self, engine: DebateEngine, backend: Backend, debates: list[Debate],
                  states: dict[str, _DebateState]) -> None:
        """Rate every answer of each debate's last round; set what peers will see of it next round."""
        cfg = self.config
        jobs = []
        for d in debates:
            st = states[d.debate_id]
            st.ignored = set()
            stage = st.agenda.stage if st.agenda and d.round >= 1 else None  # round 0 ran under no stage
            jobs += [(d, d.round, t.agent, moderator_messages(d, t, stage, cfg.solution_chars)) for t in d.last_turns]
        comps = self._call(engine, backend, "moderator", jobs, cfg.moderator_max_tokens, cfg.judge_temperature)
        conflict: dict[str, bool] = {}
        for (d, rnd, agent, _), c in zip(jobs, comps):
            st = states[d.debate_id]
            rating = parse_rating(c.text) if c.error is None else ModeratorRating(
                1.0, "none", None, "", f"error: {c.error}", malformed=True)
            action = moderator_action(rating, cfg.relevance_threshold)
            turn = d.last_turns[agent]
            if action == "ignore":
                st.ignored.add(agent)
            elif action == "demote":
                turn.peer_summary = rating.summary or _clip(turn.conclusion, 200)
            conflict[d.debate_id] = conflict.get(d.debate_id, False) or (
                not rating.malformed and rating.conflict == "contradiction")
            d.trace.add_extra_call(ExtraCall(
                "moderator", rnd, c.prompt_tokens, c.completion_tokens, c.text or "",
                {"relevance": rating.relevance, "conflict": rating.conflict, "accept": rating.accept,
                 "summary": rating.summary, "reason": rating.reason, "malformed": rating.malformed,
                 "action": action}, agent=agent, error=c.error))
        for d in debates:
            st = states[d.debate_id]
            if st.agenda and d.round >= 1:
                st.agenda.record_round(conflict.get(d.debate_id, False))
