"""Deprecated alias: `python -m eval.corpus` is `python -m simworld.corpus` (corpus collection moved to the
`simworld` application). Running or importing this module warns (FutureWarning) and uses the new code."""

from dear.deprecation import warn_moved_module
from simworld.corpus import *  # noqa: F401,F403
from simworld.corpus import PROG, main

warn_moved_module("eval.corpus", "simworld.corpus")

if __name__ == "__main__":
    from dear.cli import run as run_cli

    run_cli(main, PROG)
