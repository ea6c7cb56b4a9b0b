"""A bank's stored samples as the sampling rules read them (`dear.debate.sampling_rules.Samples`): answers, grades,
tokens and one confidence summary per sample, in stored order. Read by the replay report (eval.bank_replay) and the
bank world's learning check (train.bank_check)."""

from __future__ import annotations

from collections.abc import Sequence

from dear.bank.store import BankSample
from dear.confidence import record_of
from dear.debate.sampling_rules import Samples


def confidence_of(sample: BankSample, summary: str) -> float | None:
    """The sample's confidence summary (None when it has no record or the summary is None)."""
    record = record_of(sample.confidence)
    return None if record is None else record.value(summary)


def samples_of(bank_samples: Sequence[BankSample], summary: str) -> Samples:
    return Samples(tuple(b.answer_key for b in bank_samples), tuple(bool(b.correct) for b in bank_samples),
                   tuple(int(b.tokens) for b in bank_samples),
                   tuple(confidence_of(b, summary) for b in bank_samples))
