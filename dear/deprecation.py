"""Old names that still work: renamed config keys and command-line flags, moved modules and files, each with one
deprecation message.

One place for the rule "the old name loads, says which name replaces it, and may not be given beside the new
one", used by the training config, the policy config, saved settings and every CLI."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Mapping
from typing import Any


def rename_keys(data: Mapping[str, Any], renamed: Mapping[str, str], where: str = "", *, prefix: str = "",
                label: str = "key", warn: bool = True, error: type[ValueError] = ValueError) -> dict[str, Any]:
    """A copy of the flat mapping `data` with each old key of `renamed` (old -> new) moved to its new name.

    Warns (FutureWarning) once per old key found: "{where}{label} '{prefix}{old}' is deprecated; use
    '{prefix}{new}'" (`prefix` names the section of a nested config, e.g. "env."). `warn=False` for files the
    project wrote itself. Giving both names raises `error` naming both."""
    out = dict(data)
    for old, new in renamed.items():
        if old not in out:
            continue
        if new in out:
            raise error(f"{where}keys '{prefix}{old}' and '{prefix}{new}' are the same setting (the first is its "
                        f"old name); keep only '{prefix}{new}'")
        if warn:
            warnings.warn(f"{where}{label} '{prefix}{old}' is deprecated; use '{prefix}{new}'", FutureWarning,
                          stacklevel=3)
        out[new] = out.pop(old)
    return out


def renamed_keyword(where: str, old: str, new: str, value: Any, keywords: dict[str, Any]) -> Any:
    """The value of keyword `new`, else of its old name `old` taken out of `keywords` (a function's ``**kwargs``)
    with a FutureWarning naming the new one. Both given: ValueError naming both."""
    if old not in keywords:
        return value
    given = {new: value} if value is not None else {}
    return rename_keys(given | {old: keywords.pop(old)}, {old: new}, f"{where}: ", label="keyword")[new]


class RenamedFlag(argparse.Action):
    """An old flag that stores into its new flag's destination and prints a one-line deprecation warning.

    `parser.add_argument("--agents", dest="n_agents", type=int, action=RenamedFlag, new="--n-agents")`;
    the old flag is hidden from --help (`help=argparse.SUPPRESS` is the default here)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_flags(parser: argparse.ArgumentParser, renamed: Mapping[str, str]) -> None:
    """Register each old flag of `renamed` (old -> new, both spelled with dashes) as a RenamedFlag.

    The old flag takes the new flag's type and destination, so it must be added after the new one."""
    actions = {s: a for a in parser._actions for s in a.option_strings}
    for old, new in renamed.items():
        target = actions.get(new)
        if target is None:
            raise ValueError(f"add_renamed_flags: {new} is not a flag of {parser.prog}; add it first")
        parser.add_argument(old, dest=target.dest, type=target.type, nargs=target.nargs, action=RenamedFlag, new=new)


def warn_moved_module(old: str, new: str, note: str = "") -> None:
    """The FutureWarning of an old module path kept as a thin alias (call it at the alias's top level): names the
    module, and the command `python -m {new}`, that replace it."""
    warnings.warn(f"{old} has moved to {new} (`python -m {new}`){note}; the old path is a deprecated alias",
                  FutureWarning, stacklevel=2)


# Files that moved: a stored setting that names the old path means the new one (a byte-identical copy).
MOVED_FILES = {
    "results/corpus-gsm8k/evidence/sim_params_synthetic_texts.json":
        "worlds/gsm8k-fitted/sim_params_synthetic_texts.json",
    "results/corpus-gsm8k/evidence/text_bank.json.gz": "worlds/gsm8k-fitted/text_bank.json.gz",
}


def with_moved_files(data: Any) -> Any:
    """A copy of stored settings (nested dicts, lists, strings) in which every string naming a moved file names its
    new path, so that settings saved before the move compare equal to the same settings today."""
    if isinstance(data, str):
        return MOVED_FILES.get(data, data)
    if isinstance(data, dict):
        return {k: with_moved_files(v) for k, v in data.items()}
    if isinstance(data, list):
        return [with_moved_files(v) for v in data]
    return data
