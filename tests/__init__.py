"""The test suite, laid out like the code it tests: tests/dear/debate/ tests dear/debate/, tests/train/ train/, and
so on; tests/project/ holds the checks of the whole repository (floors, names, dependencies, docs, CLI flags)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository, whatever folder a test sits in
