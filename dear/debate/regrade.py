"""Re-grade a stored debate with today's parser, answer classes and vote, without calling any model.

Every turn's answer is extracted again from its stored completion text (`prompts.extract`: the agent's own
answer, never an echoed one; a letter that is not an option is no answer), normalised, grouped into the
debate's answer classes in round/agent order (as the engine does while it runs) and graded against the gold
answer. The final vote is then taken again by the rule that took it (the last round, or every new sample for a
policy that votes over all answers, or every new sample weighted by its stored confidence): its score over tied leaders, and its seeded pick with the engine's own RNG
(`vote_seed_of`, the last round's index), so an unchanged vote keeps its pick. The rule is the one the trace
records (`DebateTrace.decision`); a trace written before every rule was recorded is re-voted only by the rule its
caller names (`vote_rule`, eval.regrade's --vote-rule), never by one guessed from its stored vote: without one it
is refused (`MissingVoteRule`). The rule used is recorded in the re-graded trace.
A trace that holds no vote (a stored round 0 that other debates continue) gets none.

A silent turn (the agent read nobody and kept its previous turn, with no model call) keeps that turn's answer
and grade as they are re-graded, exactly as the engine gives it.
A program-of-thought turn (style `pot`) is re-graded from the program output stored with it (`AgentTurn.program`:
the last line it printed, read by today's extractor); no program is run again.

What the debate *did* does not change: prompts, completions, masks, sampling, tokens, and the reasoning and
conclusion texts the regulator read stay as stored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dear.debate import prompts
from dear.debate.engine import DECISIONS, confidence_weights, graded_answer, vote_seed_of
from dear.debate.trace import AgentTurn, DebateTrace, voting_turns
from dear.tasks.equivalence import AnswerClasses
from dear.tasks.types import Question
from dear.vote import vote

def regrade_turn(turn: AgentTurn, question: Question, classes: AnswerClasses) -> AgentTurn:
    """`turn` with its answer, key, grade and grader recomputed from its stored text, as the engine grades it. A
    program-of-thought turn's program is never run again: its answer is read from the output stored with it."""
    answer, key, correct, grader = graded_answer(turn.text, turn.finish_reason, turn.error, question,
                                                 turn.style or prompts.DEFAULT_STYLE,  # the style it was prompted in
                                                 program=turn.program, run_programs=False)
    key = classes.canonical(key) if key is not None else None
    return replace(turn, answer=answer, answer_key=key, correct=correct, grader=grader)


def kept_answer(turn: AgentTurn, kept: AgentTurn) -> AgentTurn:
    """A silent turn (it read nobody and repeats `kept`, the agent's previous turn) with `kept`'s answer and grade:
    its text is not parsed again, since a text cut at the token limit would then find an answer it never marked."""
    return replace(turn, answer=kept.answer, answer_key=kept.answer_key, correct=kept.correct, grader=kept.grader)


class MissingVoteRule(ValueError):
    """A stored vote whose rule the trace does not record, and no rule was named for it."""


def vote_rule_of(trace: DebateTrace, vote_rule: str | None = None) -> str:
    """The rule `trace`'s final vote is taken by: the one it records, else `vote_rule` (named by the caller for
    traces that record none). MissingVoteRule when neither names one: a rule is never guessed."""
    if vote_rule is not None and vote_rule not in DECISIONS:
        raise ValueError(f"vote rule must be one of {DECISIONS}, got {vote_rule!r}")
    if trace.decision is not None:
        return trace.decision
    if vote_rule is None:
        raise MissingVoteRule(f"debate {trace.debate_id} records no vote rule")
    return vote_rule


def regrade_trace(trace: DebateTrace, question: Question, engine_seed: int,
                  vote_rule: str | None = None) -> DebateTrace:
    """A copy of `trace` graded by today's rules (module docstring). `vote_rule` (DECISIONS) re-votes a trace
    that records no rule of its own; a trace that records one keeps it."""
    if question.id != trace.question_id:
        raise ValueError(f"regrade_trace: trace of {trace.question_id!r} given question {question.id!r}")
    if vote_rule is not None and vote_rule not in DECISIONS:
        raise ValueError(f"vote rule must be one of {DECISIONS}, got {vote_rule!r}")
    classes = AnswerClasses(question.kind)
    rounds: list[list[AgentTurn]] = []
    for turns in trace.rounds:
        before = {t.agent: t for t in rounds[-1]} if rounds else {}
        rounds.append([kept_answer(t, before[t.agent]) if t.silent and t.agent in before
                       else regrade_turn(t, question, classes) for t in turns])
    out = replace(trace, gold=question.gold, kind=question.kind, rounds=rounds)
    out.discarded_rounds = [[regrade_turn(t, question, classes) for t in turns]
                            for turns in trace.discarded_rounds]
    if trace.failed or not out.rounds:
        out.set_vote(None)
        return out
    if trace.final_score is None and not trace.vote_counts:
        return out  # never voted (a stored round 0 that later rounds continue), or nobody ever answered
    decision = vote_rule_of(trace, vote_rule)
    if decision == "belief-weighted":
        raise ValueError(f"debate {trace.debate_id}: a belief-weighted vote needs the certainties the regulator "
                         "measured, which the trace does not hold; it cannot be re-voted")
    voters = voting_turns(out.rounds, decision)
    rng = np.random.default_rng([vote_seed_of(engine_seed, trace.seed), len(out.rounds) - 1])
    weights = None
    if decision == "confidence-weighted":  # the confidences are stored with the turns, the temperature with the trace
        if trace.vote_tau is None:
            raise MissingVoteRule(f"debate {trace.debate_id}: a confidence-weighted vote without its vote_tau")
        weights = confidence_weights(voters, trace.vote_tau, trace.debate_id)
    out.set_vote(vote([t.answer_key for t in voters], [t.correct for t in voters], rng, weights))
    out.decision = decision  # recorded: the next re-grade needs no rule named
    return out


@dataclass(frozen=True)
class TraceChange:
    """What re-grading changed in one debate."""

    question_id: str
    turns_changed: int  # turns whose extracted answer or grade changed
    old_correct: bool  # the stored final (seeded pick) correctness
    new_score: float  # ties as expected values
    new_correct: bool  # the new seeded pick
    old_final: str | None
    new_final: str | None
    old_score: float | None = None  # the stored score (ties as expected values)


def change_of(old: DebateTrace, new: DebateTrace) -> TraceChange:
    changed = sum(a.answer != b.answer or a.correct != b.correct
                  for ta, tb in zip(old.rounds, new.rounds) for a, b in zip(ta, tb))
    return TraceChange(question_id=old.question_id, turns_changed=changed, old_correct=bool(old.final_correct),
                       new_score=new.final_expected, new_correct=bool(new.final_correct),
                       old_final=old.final_answer, new_final=new.final_answer, old_score=old.final_expected)
