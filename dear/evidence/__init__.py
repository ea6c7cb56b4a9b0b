"""Encoders (text -> unit vectors) and pairwise evidence e_ij between debating agents (docs/DESIGN.md §3)."""

from dear.evidence.encoders import (
    DEFAULT_ENCODER,
    BGEM3Encoder,
    Encoder,
    EncoderError,
    HashingEncoder,
    SentenceTransformerEncoder,
    make_encoder,
)
from dear.evidence.similarity import answer_aware_evidence, pairwise_evidence

__all__ = [
    "DEFAULT_ENCODER",
    "BGEM3Encoder",
    "Encoder",
    "EncoderError",
    "HashingEncoder",
    "SentenceTransformerEncoder",
    "answer_aware_evidence",
    "make_encoder",
    "pairwise_evidence",
]
