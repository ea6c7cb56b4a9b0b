"""Configuration of the interventions: which are switched on and their budgets (`InterventionConfig`), the
vocabulary their prompts and parsers share (seed 000's error types, seed 002's agenda stages, the moderator's
conflict labels) and the judge's named instructions (`JudgePrompt`, `JUDGE_PROMPTS`)."""

from __future__ import annotations

from dataclasses import dataclass

from dear.debate.engine import T_MAX

ERROR_TYPES = (
    "lack of progress", "low-quality feedback", "low-quality engagement",  # temporal (seed 000)
    "lack of clarity", "task non-compliance", "knowledge gap", "logical error", "language error",  # local
)
AGENDA_STAGES = ("problem_definition", "argument", "rebuttal", "evidence", "synthesis")
STAGE_INSTRUCTIONS = {
    "problem_definition": "Agenda stage: problem definition. In this round, restate what exactly is asked, the "
                          "given quantities and constraints, and correct any misreading of the problem.",
    "argument": "Agenda stage: argument. In this round, state your core claim and the reasoning that supports it.",
    "rebuttal": "Agenda stage: rebuttal. In this round, point out concrete logical gaps or factual errors in the "
                "other answers (or confirm they hold); do not introduce unrelated new claims.",
    "evidence": "Agenda stage: evidence. In this round, verify the disputed steps by explicit calculation or "
                "checkable facts; do not propose new arguments.",
    "synthesis": "Agenda stage: synthesis. In this round, summarise what the discussion has established and "
                 "settle on the best-supported answer.",
}
CONFLICTS = ("none", "redundant", "contradiction")


@dataclass(frozen=True)
class JudgePrompt:
    """One DRIFTJudge instruction (a format string over prev, cur, prev_answers, cur_answers) and its reply.

    `names_answer`: the judge replies with the answer it finds correct (`\\boxed{}`), not a verdict; drift is
    then FOCUS < 0 with that answer as the key (`judge_verdict`), and rounds whose plurality did not change
    need no call (`needs_judge_call`).
    """

    template: str
    max_tokens: int = 160
    names_answer: bool = False


# The judge's instruction, by name (InterventionConfig.judge_prompt). "basic" asks for the verdict first, in seed
# 000's terms. "stepwise" lists both rounds' final answers, says what is not drift and asks for the comparison
# before the verdict: a 1.5B judge under "basic" called 17 of 18 pilot rounds drift, 16 of them unchanged.
# Measured on 48-71 corpus round pairs, neither discriminates (basic flags ~all, stepwise ~none;
# results/judge-gsm8k-train). "verify" asks the judge to check the problem and name the correct answer, so it
# only has to verify, which is what FOCUS measures; the 1.5B judge then names an answer in ~11 tokens without
# checking. "verify-cot" asks for its own solution first.
JUDGE_PROMPTS = {
    "basic": JudgePrompt(
        "Problem drift means that a discussion moves away from solving its problem: the newer round's solutions "
        "are worse than the previous round's (a correct line of reasoning was abandoned, a well-supported answer "
        "was changed without a good reason, the agents went off topic or stopped following the task). "
        "Did the discussion drift from round {prev} to round {cur}?\n"
        "Reply in exactly this format:\nVerdict: DRIFT or NO DRIFT\nReason: <one sentence>"
    ),
    "stepwise": JudgePrompt(
        "Final answers in round {prev}: {prev_answers}. Final answers in round {cur}: {cur_answers}.\n"
        "Problem drift means the newer round is a step backwards on this problem: an agent gave up a "
        "well-supported answer for a worse one, the reasoning became wrong or irrelevant, or an agent stopped "
        "following the task. Agents keeping their answers, agreeing after checking, or correcting a mistake is "
        "not drift. Most rounds do not drift.\n"
        "First compare the two rounds in one sentence, then decide whether round {cur} drifted.\n"
        "Reply in exactly this format:\nReason: <one sentence>\nVerdict: NO DRIFT or DRIFT"
    ),
    "verify": JudgePrompt(
        "Final answers in round {prev}: {prev_answers}. Final answers in round {cur}: {cur_answers}.\n"
        "The agents changed their answers, so at most one of these answers is right. Check the agents' "
        "reasoning against the problem and work out briefly, step by step, which final answer is correct.\n"
        "End with exactly this line:\nCorrect answer: \\boxed{{<the correct final answer>}}",
        max_tokens=384, names_answer=True,
    ),
    "verify-cot": JudgePrompt(
        "Final answers in round {prev}: {prev_answers}. Final answers in round {cur}: {cur_answers}.\n"
        "The agents changed their answers, so at most one of these answers is right. Do not trust the agents: "
        "solve the problem yourself, step by step, then say which final answer is correct.\n"
        "Reply in exactly this format:\nCheck: <your own step-by-step solution>\n"
        "Correct answer: \\boxed{{<the correct final answer>}}",
        max_tokens=384, names_answer=True,
    ),
}


@dataclass(frozen=True)
class InterventionConfig:
    judge: bool = False
    policy: bool = False  # needs judge
    regenerate: bool = False  # needs judge
    moderator: bool = False
    agenda: bool = False  # needs moderator (its conflict ratings drive the stages)
    judge_final_round: bool = True  # judge the last round too (only detection; policy has no next round there)
    judge_temperature: float = 0.0
    judge_prompt: str = "verify-cot"  # a key of JUDGE_PROMPTS; the default is the best measured on the corpus
    judge_max_tokens: int | None = None  # None = the prompt's own budget (JudgePrompt.max_tokens)
    policy_max_tokens: int = 200
    moderator_max_tokens: int = 160
    solution_chars: int = 600  # reasoning characters of each solution shown to the judge / moderator
    regenerate_temperature: float = 1.0  # a redone round samples at least this hot
    relevance_threshold: float = 0.7  # seed 002's default
    agenda_quiet_rounds: int = 2  # rounds without new contradiction that end a stage
    agenda_max_stage_rounds: int = 2  # rounds after which a stage ends anyway

    def __post_init__(self):
        if (self.policy or self.regenerate) and not self.judge:
            raise ValueError("InterventionConfig: policy and regenerate act on the judge's verdicts; set judge=True")
        if self.policy and self.regenerate:
            raise ValueError("InterventionConfig: choose policy or regenerate (seed 000 compares them separately)")
        if self.agenda and not self.moderator:
            raise ValueError("InterventionConfig: agenda advances on the moderator's conflict ratings; "
                             "set moderator=True")
        if not 0.0 <= self.relevance_threshold <= 1.0:
            raise ValueError(f"InterventionConfig.relevance_threshold must be in [0, 1], got {self.relevance_threshold}")
        if not 0.0 < self.regenerate_temperature <= T_MAX:
            raise ValueError(f"InterventionConfig.regenerate_temperature must be in (0, {T_MAX}], "
                             f"got {self.regenerate_temperature}")
        if self.judge_prompt not in JUDGE_PROMPTS:
            raise ValueError(f"InterventionConfig.judge_prompt must be one of {sorted(JUDGE_PROMPTS)}, "
                             f"got {self.judge_prompt!r}")
        if not 0.0 <= self.judge_temperature <= T_MAX:
            raise ValueError(f"InterventionConfig.judge_temperature must be in [0, {T_MAX}], got {self.judge_temperature}")
        for name in ("judge_tokens", "policy_max_tokens", "moderator_max_tokens", "agenda_quiet_rounds",
                     "agenda_max_stage_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"InterventionConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.solution_chars < 0:
            raise ValueError(f"InterventionConfig.solution_chars must be >= 0, got {self.solution_chars}")

    @property
    def judge_tokens(self) -> int:
        """The judge's completion budget: `judge_max_tokens`, or the prompt's own."""
        return self.judge_max_tokens or JUDGE_PROMPTS[self.judge_prompt].max_tokens

    @property
    def any(self) -> bool:
        return self.judge or self.moderator

    def label(self) -> str:
        """`judge+policy`, `moderator`, ... (the suffix of a method name)."""
        parts = [n for n in ("judge", "policy", "regenerate") if getattr(self, n)]
        if self.moderator:
            parts.append("moderator" if self.agenda else "moderator-noagenda")
        return "+".join(parts)
