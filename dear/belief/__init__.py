"""Subjective-logic opinions and Dempster-Shafer fusion, batched in torch over (B debates, V agents).

See docs/DESIGN.md §3 and §5; the tests check them against a float64 numpy loop implementation
(tests/dear/belief/reference.py).
"""

from dear.belief.dempster_shafer import (
    EVIDENCE_U_FLOOR,
    FUSION_RULES,
    TOTAL_CONFLICT_EPS,
    Combined,
    Fused,
    combine,
    fuse,
)
from dear.belief.subjective_logic import Opinion, opinions

__all__ = [
    "EVIDENCE_U_FLOOR",
    "FUSION_RULES",
    "TOTAL_CONFLICT_EPS",
    "Combined",
    "Fused",
    "Opinion",
    "combine",
    "fuse",
    "opinions",
]
