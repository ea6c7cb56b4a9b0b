"""Debate interventions from the seed papers, wrapped around any protocol (MAD, the DEAR regulator, ...).

- DRIFTJudge (seed 000): after each exchange round one judge call per debate sees the previous and the current
  round's solutions and answers "Verdict: DRIFT | NO DRIFT" with a reason. Unparsable output counts as no drift
  and is marked `malformed`. Under a prompt that `names_answer` ("verify") the judge instead names the answer it
  finds correct, and FOCUS with that answer as the key decides drift; a round whose plurality did not change
  cannot drift under any key, so it gets no call (recorded as `skipped`).
- DRIFTPolicy (seed 000): on a flagged round a feedback call names the error types (seed 000's taxonomy) and
  writes advice; the advice is added to every debater's prompt of the NEXT round (RoundControl.guidance).
- Regenerate (seed 000): a flagged round is dropped and run again once at a non-zero temperature
  (DebateEngine.redo_last_round); a redone round is never judged or redone again.
- Moderator (seed 002): before the next round, one call per new answer rates relevance (0-1) and conflict
  (none / redundant / contradiction) as JSON. Relevance below the threshold -> the answer is ignored (peers do not
  see it next round); redundant, or refused by the moderator -> demoted (peers see its one-line summary and final
  answer); otherwise accepted. Unparsable output -> accepted, marked `malformed`. The answers of the last round
  are not rated: nobody reads them afterwards.
- Agenda (seed 002): problem definition -> argument -> rebuttal -> evidence -> synthesis. Each exchange round
  gets its stage's instruction; the stage advances after `agenda_quiet_rounds` rounds without a new
  contradiction (from the moderator's ratings) or after `agenda_max_stage_rounds` rounds in the stage.

Every extra call is recorded in the trace (`DebateTrace.extra_calls`) with its tokens, apart from the debaters'
tokens; a dropped round's turns go to `discarded_rounds` and their tokens to the extra tally too. Round 0 is never
changed, so it stays identical (and cache-shared) with the plain protocol's round 0.

The package, each module importing only those before it: `config` (InterventionConfig, the shared vocabulary, the
judge's named prompts) <- `parsing` (reading completions) and `prompts` (building requests) <- `judging` (the
drift rule shared with eval/judge_offline.py) <- `protocol` (InterventionProtocol, AgendaState); `summary` reads
finished traces for the reports. Every public name is re-exported here.
"""

from dear.debate.interventions.config import (
    AGENDA_STAGES,
    CONFLICTS,
    ERROR_TYPES,
    JUDGE_PROMPTS,
    STAGE_INSTRUCTIONS,
    InterventionConfig,
    JudgePrompt,
)
from dear.debate.interventions.judging import (
    SKIPPED_REASON,
    focus_drift,
    judge_verdict,
    needs_judge_call,
    round_outcome,
)
from dear.debate.interventions.parsing import (
    Advice,
    JudgeVerdict,
    ModeratorRating,
    moderator_action,
    parse_advice,
    parse_rating,
    parse_verdict,
)
from dear.debate.interventions.prompts import (
    ADVICE_PREFIX,
    JUDGE_SYSTEM,
    MODERATOR_SYSTEM,
    MODERATOR_TASK,
    POLICY_SYSTEM,
    POLICY_TASK,
    intervention_request,
    judge_messages,
    moderator_messages,
    policy_messages,
)
from dear.debate.interventions.protocol import AgendaState, InterventionProtocol
from dear.debate.interventions.summary import InterventionSummary, judged_pairs, summarize_interventions

__all__ = [
    "ADVICE_PREFIX", "AGENDA_STAGES", "CONFLICTS", "ERROR_TYPES", "JUDGE_PROMPTS", "JUDGE_SYSTEM",
    "MODERATOR_SYSTEM", "MODERATOR_TASK", "POLICY_SYSTEM", "POLICY_TASK", "SKIPPED_REASON", "STAGE_INSTRUCTIONS",
    "Advice", "AgendaState", "InterventionConfig", "InterventionProtocol", "InterventionSummary", "JudgePrompt",
    "JudgeVerdict", "ModeratorRating",
    "focus_drift", "intervention_request", "judge_messages", "judge_verdict", "judged_pairs", "moderator_action",
    "moderator_messages", "needs_judge_call", "parse_advice", "parse_rating", "parse_verdict", "policy_messages",
    "round_outcome", "summarize_interventions",
]
