"""Deprecated alias: `python -m eval.fit_corpus` is `python -m simworld.fit` (the simulator's fit moved to the
`simworld` application; its validation is `simworld.validation`). Running or importing this module warns
(FutureWarning) and uses the new code."""

from dear.deprecation import warn_moved_module
from simworld.fit import *  # noqa: F401,F403
from simworld.fit import PROG, main
from simworld.validation import *  # noqa: F401,F403

warn_moved_module("eval.fit_corpus", "simworld.fit")

if __name__ == "__main__":
    from dear.cli import run as run_cli

    run_cli(main, PROG)
