"""The settings guard of a resumable experiment directory: `settings.json` is written on the first run, and a later
run with other settings is refused (its records would not belong to the same experiment).

`DebateRunSettings` holds what every such experiment of debates shares (the questions, the model, the debate's
shape); an experiment's own settings class extends it (`eval.layouts.LayoutSettings`,
`simworld.corpus.CorpusSettings`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from dear.atomic import write_json


@dataclass(frozen=True)
class DebateRunSettings:
    """The settings a resumed experiment of debates must share with the run that began it."""

    task: str
    split: str
    data_seed: int
    seed: int
    llm: str
    n_agents: int
    n_rounds: int
    max_tokens: int

    @classmethod
    def shared_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The fields of this base class, read from the parsed flags of the same names."""
        return {f.name: getattr(args, f.name) for f in fields(DebateRunSettings)}


def guard_settings(path: Path, settings: Any, hint: str = "use another --out") -> None:
    """Write `settings` (a dataclass) to `path`, or raise ValueError naming what differs from the stored ones."""
    wanted = json.loads(json.dumps(asdict(settings)))  # tuples -> lists, as stored
    if not path.exists():
        write_json(path, wanted, indent=2, trailing_newline=True)
        return
    try:
        stored = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    changed = {k: (stored.get(k), v) for k, v in wanted.items() if stored.get(k) != v}
    if changed:
        raise ValueError(f"{path} was made with other settings (stored, now): {changed}; {hint}")


def open_run_dir(root: Path, settings: Any, hint: str = "use another --out") -> Path:
    """Create the experiment directory `root` (refusing a file in its place) and guard its settings.json."""
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"--out {root} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    guard_settings(root / "settings.json", settings, hint)
    return root
