"""The `sim` backend's old module path: the simulated world is `dear.sim` (model, parameters, text bank,
`SimBackend`). This module re-exports it so that `from dear.llm.sim import SimBackend` keeps working."""

from dear.sim import *  # noqa: F401,F403
from dear.sim import __all__  # noqa: F401
