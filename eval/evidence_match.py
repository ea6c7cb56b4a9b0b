"""Deprecated alias: `python -m eval.evidence_match` is `python -m simworld.evidence_match` (moved to the
`simworld` application). Running or importing this module warns (FutureWarning) and uses the new code."""

from dear.deprecation import warn_moved_module
from simworld.evidence_match import *  # noqa: F401,F403
from simworld.evidence_match import PROG, main

warn_moved_module("eval.evidence_match", "simworld.evidence_match")

if __name__ == "__main__":
    from dear.cli import run as run_cli

    run_cli(main, PROG)
