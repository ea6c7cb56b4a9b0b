"""Deprecated alias: `python -m eval.fit_sim` (the first, MAP fit on a trace file, and `--collect`) is
`python -m simworld.map_fit`. Its library moved too: records and the likelihood to `dear.sim.records` /
`dear.sim.likelihood`, the maximum-likelihood fit to `simworld.mle`, rates and replay to `simworld.rates` /
`simworld.replay`. Running or importing this module warns (FutureWarning) and uses the new code."""

from dear.deprecation import warn_moved_module
from dear.sim.likelihood import *  # noqa: F401,F403
from dear.sim.model import N_DISTRACTORS, kappa_of  # noqa: F401
from dear.sim.records import *  # noqa: F401,F403
from simworld.map_fit import *  # noqa: F401,F403
from simworld.map_fit import PROG, main
from simworld.mle import *  # noqa: F401,F403
from simworld.rates import *  # noqa: F401,F403
from simworld.replay import *  # noqa: F401,F403

warn_moved_module("eval.fit_sim", "simworld.map_fit", "; the maximum-likelihood fit is `python -m simworld.fit`")

if __name__ == "__main__":
    from dear.cli import run as run_cli

    run_cli(main, PROG)
