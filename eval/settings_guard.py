"""The settings guard of a resumable experiment directory: `settings.json` is written on the first run, and a later
run with other settings is refused (its records would not belong to the same experiment)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dear.atomic import write_json


def guard_settings(path: Path, settings: Any, prog: str, hint: str = "use another --out") -> None:
    """Write `settings` (a dataclass) to `path`, or exit with one line naming what differs from the stored ones."""
    wanted = json.loads(json.dumps(asdict(settings)))  # tuples -> lists, as stored
    if not path.exists():
        write_json(path, wanted, indent=2, trailing_newline=True)
        return
    try:
        stored = json.loads(path.read_text())
    except ValueError as e:
        raise SystemExit(f"{prog}: error: {path} is not valid JSON: {e}") from None
    changed = {k: (stored.get(k), v) for k, v in wanted.items() if stored.get(k) != v}
    if changed:
        raise SystemExit(f"{prog}: error: {path} was made with other settings (stored, now): {changed}; {hint}")
