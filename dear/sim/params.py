"""The simulated world's parameters: `SimParams` (the equations they enter are in `dear/sim/__init__.py`) and
the labels every simulated output carries."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dear.atomic import write_json

SIM_MODEL_ID = "sim-v1"
LOG_PREFIX = "[synthetic]"


@dataclass
class SimParams:
    """All parameters of the population model (equations in the `dear.sim` docstring). JSON round-trips."""

    # round 0
    skills: list[float] = field(default_factory=lambda: [0.2, 0.0, -0.2])  # per agent, cycled for V agents
    difficulty_center: float = 0.6  # c
    difficulty_scale: float = 1.15  # k
    temp_penalty: float = 0.5  # τ: hotter sampling, fewer correct first answers
    t_ref: float = 0.7  # T0
    top_p_ref: float = 0.9  # P0
    top_p_weight: float = 0.5  # w_p
    distractor_decay: float = 1.5  # λ
    p_unique_wrong: float = 0.08  # u
    # traps: a question (drawn per question) is a trap with probability σ(logit(π) + γ·(d − c)), d its difficulty
    # logit: it has a popular mistake that takes a wrong draw with probability ρ before u and λ act; π = 0: no traps
    # (the worlds fitted before them)
    trap_share: float = 0.0  # π, at the centre difficulty d = c
    trap_slope: float = 0.0  # γ: harder questions are traps more often when > 0
    trap_pull: float = 0.0  # ρ
    # rounds >= 1
    self_revise_bias: float = -3.5  # s0
    self_revise_temp: float = 1.5  # s1
    switch_bias: float = -2.2  # a0
    switch_disagree: float = 2.0  # a1
    switch_agree: float = 3.0  # a2
    switch_temp: float = 1.5  # a3
    p_resolve: float = 0.7  # ρ
    resolve_bonus: float = 1.8  # β
    # text
    words_base: float = 55.0
    words_per_temp: float = 70.0
    words_sd: float = 6.0  # spread of the body's length around words_base + words_per_temp·T
    # token counting (the fit takes both from the corpus; the defaults are the stylised world's)
    prompt_chars_per_token: float = 4.0  # prompt_tokens = characters of all messages / this
    text_chars_per_token: float = 0.0  # 0: one pseudo-word per completion token; > 0: n tokens are n·c characters
    # bank texts (used only with a text bank; simworld.evidence_match fits both): 1 and 0 = whole real completions
    bank_sentence_keep: float = 1.0  # each reasoning sentence of the bank text is kept with this probability
    bank_sentence_mix: float = 0.0  # ... or first replaced, with this one, by a sentence of the question's texts
    # confidence (dear/sim/confidence.py): a sample's mean token log-probability m, log(-m) = mu_c + b_q + e with c
    # whether the sample is right, b_q ~ Normal(0, sd_question) shared by a question's samples and e ~ Normal(0, sd_c);
    # simworld.confidence_fit fits the five to a bank's real samples. sd_c 0 = no confidence model: the sim sends no
    # log-probabilities (a turn that asks records that it got none)
    confidence_mu_correct: float = 0.0
    confidence_sd_correct: float = 0.0
    confidence_mu_wrong: float = 0.0
    confidence_sd_wrong: float = 0.0
    confidence_sd_question: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.skills, (list, tuple)) or not self.skills:
            raise ValueError(f"SimParams.skills must be a non-empty list of floats, got {self.skills!r}")
        self.skills = [float(s) for s in self.skills]
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "skills":
                bad = [s for s in v if not math.isfinite(s)]
                if bad:
                    raise ValueError(f"SimParams.skills has non-finite values {bad}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"SimParams.{f.name} must be a finite number, got {v!r}")
            setattr(self, f.name, float(v))
        for name in ("p_unique_wrong", "trap_share", "trap_pull", "p_resolve", "bank_sentence_keep", "bank_sentence_mix"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"SimParams.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("difficulty_scale", "words_base", "prompt_chars_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SimParams.{name} must be > 0, got {getattr(self, name)}")
        if (self.confidence_sd_correct > 0) != (self.confidence_sd_wrong > 0):
            raise ValueError("SimParams: confidence_sd_correct and confidence_sd_wrong are both > 0 (a confidence "
                             "model) or both 0 (none)")
        for name in ("words_per_temp", "words_sd", "text_chars_per_token", "confidence_sd_correct", "confidence_sd_wrong",
                     "confidence_sd_question"):
            if getattr(self, name) < 0:
                raise ValueError(f"SimParams.{name} must be >= 0, got {getattr(self, name)}")

    @property
    def has_confidence(self) -> bool:
        """Whether the sim answers a request for log-probabilities with a confidence record."""
        return self.confidence_sd_correct > 0

    def skill(self, agent: int) -> float:
        return self.skills[agent % len(self.skills)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SimParams:
        if not isinstance(d, dict):
            raise ValueError(f"SimParams.from_dict expects a dict, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"SimParams: unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**d)

    def to_json(self, path: str | Path, **extra: Any) -> None:
        """Write {"model_id", "synthetic", "params", **extra} to a file whose name must contain 'synthetic'."""
        path = Path(path)
        if "synthetic" not in path.name:
            raise ValueError(f"sim parameter files are labelled synthetic: put 'synthetic' in the name ({path})")
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"model_id": SIM_MODEL_ID, "synthetic": True, "params": self.to_dict(), **extra}
        write_json(path, doc, indent=2, trailing_newline=True)

    @classmethod
    def from_json(cls, path: str | Path) -> SimParams:
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ValueError(f"sim parameter file not found: {path}") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from e
        if isinstance(doc, dict) and "params" in doc:
            doc = doc["params"]
        try:
            return cls.from_dict(doc)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
