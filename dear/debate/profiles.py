"""Agent profiles: what makes each agent of a debate its own — its backend, its reply style and its token limit.

A debate without profiles is the paper's: every agent on the engine's backend, in the `cot` style, with the debate's
`max_tokens`. `DebateConfig.agent_profiles` gives agent i profile i; a config widened beyond its pool (a
self-consistency round 0 of more samples than agents) continues the pool in order, sample k taking profile
k mod len(profiles).

Compact form (the CLIs' `--agent-profiles`, stored settings, `AgentProfile.name`): comma-separated
`[BACKEND:]STYLE[:MAX_TOKENS]`, e.g. `local:cot,local:direct:64,smoke:cot`, or `cot,cot,direct` on the run's
`--llm`. It is read from the right: a trailing number is the token limit, the part before it the style, and
everything before the style is the backend spec, which may itself hold ':' (`local:/models/x.gguf:direct`,
`openai:http://host:8000/v1#m:cot`). So the style is never optional in this form: it marks where the spec ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from dear.debate.prompts import DEFAULT_STYLE, STYLES
from dear.llm.registry import check_spec

FORM = "[BACKEND:]STYLE[:MAX_TOKENS]"
EXAMPLE = "local:cot,local:direct:64,smoke:cot"


def _problems(backend: Any, style: Any, max_tokens: Any) -> list[tuple[str, str]]:
    """(field, problem) pairs of a profile's values; empty when they are valid."""
    out = []
    if backend is not None and (not isinstance(backend, str) or not backend.strip() or "," in backend):
        out.append(("backend", f"must be a backend spec or key (a non-empty string without ','), or None for the "
                               f"debate's backend; got {backend!r}"))
    if style not in STYLES:
        out.append(("style", f"must be one of {', '.join(STYLES)}, got {style!r}"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        out.append(("max_tokens", f"must be an integer >= 1, or None for the debate's max_tokens; got {max_tokens!r}"))
    return out


@dataclass(frozen=True)
class AgentProfile:
    """One agent's backend, reply style and completion limit."""

    backend: str | None = None  # backend spec (dear.llm.registry) or key of the engine's backends; None = the debate's
    style: str = DEFAULT_STYLE  # reply style (dear.debate.prompts.STYLES): cot (reasoning), direct (answer only) or
    # pot (a program that prints the answer, run in the sandbox: dear/debate/pot.py)
    max_tokens: int | None = None  # completion tokens per reply; None = the debate's max_tokens

    def __post_init__(self):
        problems = _problems(self.backend, self.style, self.max_tokens)
        if problems:
            raise ValueError("; ".join(f"AgentProfile.{name} {text}" for name, text in problems))
        if self.backend is not None:
            object.__setattr__(self, "backend", self.backend.strip())

    @property
    def name(self) -> str:
        """The compact form, e.g. `local:direct:64` (`direct` without a backend, `cot` for the default profile)."""
        parts = [self.backend] if self.backend else []
        return ":".join([*parts, self.style] + ([str(self.max_tokens)] if self.max_tokens is not None else []))


DEFAULT_PROFILE = AgentProfile()


def parse_profile(text: str) -> AgentProfile:
    """One profile in the compact form (module docstring); its backend is checked as a spec
    (dear.llm.registry.check_spec). ValueError naming the problem otherwise."""
    rest = text.strip()
    head, sep, last = rest.rpartition(":")
    max_tokens = None
    if sep and last.isascii() and last.isdigit():  # "local:direct:64": a trailing number is the token limit
        rest, max_tokens = head, int(last)
        if max_tokens < 1:
            raise ValueError(f"the token limit must be >= 1, got {last}")
    backend, sep, style = rest.rpartition(":")
    if style not in STYLES:
        raise ValueError(f"the style must be one of {', '.join(STYLES)} (after the backend, before the token limit), "
                         f"got {style!r}")
    if sep and not backend.strip():
        raise ValueError("empty backend before ':' (leave out the backend and its ':' to use the run's --llm)")
    if backend:
        check_spec(backend)
    return AgentProfile(backend or None, style, max_tokens)


def parse_profiles(text: str) -> tuple[AgentProfile, ...]:
    """A comma-separated list in the compact form; ValueError naming the position (0-based) and text of a bad one."""
    parts = text.split(",")
    out = []
    for k, part in enumerate(parts):
        if not part.strip():
            raise ValueError(f"agent profile {k} is empty in {text!r}; the form is {FORM}, e.g. {EXAMPLE}")
        try:
            out.append(parse_profile(part))
        except ValueError as e:
            raise ValueError(f"agent profile {k} ({part.strip()!r}): {e}; the form is {FORM}, e.g. {EXAMPLE}") from None
    return tuple(out)


def profile_from_mapping(data: Any, where: str) -> AgentProfile:
    """A profile from a config mapping {backend, style, max_tokens} (every key optional); a given backend is checked
    as a spec. ValueError naming `where` and the key otherwise (e.g. "env.agent_profiles[1].style: ...")."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping with keys backend, style, max_tokens; got {data!r}")
    known = [f.name for f in fields(AgentProfile)]
    unknown = sorted(set(map(str, data)) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (known: {', '.join(known)})")
    values = {name: data.get(name, getattr(DEFAULT_PROFILE, name)) for name in known}
    problems = _problems(values["backend"], values["style"], values["max_tokens"])
    if problems:
        raise ValueError("; ".join(f"{where}.{name}: {text}" for name, text in problems))
    if values["backend"] is not None:
        try:
            check_spec(values["backend"])
        except ValueError as e:
            raise ValueError(f"{where}.backend: {e}") from None
    return AgentProfile(**values)


def as_profiles(items: Iterable[Any], where: str) -> tuple[AgentProfile, ...]:
    """Profiles from AgentProfile objects, mappings (as `dataclasses.asdict` writes them) or compact strings; the
    mappings and strings are validated, errors name `where` and the index."""
    out = []
    for k, item in enumerate(items):
        if isinstance(item, AgentProfile):
            out.append(item)
        elif isinstance(item, str):
            try:
                out.append(parse_profile(item))
            except ValueError as e:
                raise ValueError(f"{where}[{k}] ({item!r}): {e}") from None
        else:
            out.append(profile_from_mapping(item, f"{where}[{k}]"))
    if not out:
        raise ValueError(f"{where}: no profiles given (leave it unset for the default agents)")
    return tuple(out)


def profile_at(profiles: Sequence[AgentProfile] | None, agent: int) -> AgentProfile:
    """Agent `agent`'s profile: the pool in order, continued cyclically past its end; the default without a pool."""
    return profiles[agent % len(profiles)] if profiles else DEFAULT_PROFILE


def on_backend(profiles: Sequence[AgentProfile], default: str) -> tuple[AgentProfile, ...]:
    """The profiles with every missing backend set to `default` (the run's --llm spec), so that each names its spec."""
    return tuple(p if p.backend else AgentProfile(default, p.style, p.max_tokens) for p in profiles)


def backend_specs(profiles: Sequence[AgentProfile]) -> list[str]:
    """The distinct backends the profiles name, in order of first use (each needs one backend object)."""
    return list(dict.fromkeys(p.backend for p in profiles if p.backend))


def without_backend(name: str) -> str:
    """A compact profile name with its backend left out (`local:direct:64` -> `direct:64`): how a policy trained on
    one backend's profiles recognises them when a run names their backend."""
    parts = name.split(":")
    style_at = len(parts) - 2 if len(parts) > 1 and parts[-1].isascii() and parts[-1].isdigit() else len(parts) - 1
    return ":".join(parts[style_at:])


def feature_vocabulary(profiles: Sequence[AgentProfile]) -> tuple[str, ...]:
    """A profile feature's one-hot order: the pool's distinct profile names without their backend, in pool order."""
    return tuple(dict.fromkeys(without_backend(p.name) for p in profiles))


def in_vocabulary(name: str, vocabulary: Sequence[str]) -> str:
    """`name` as a policy's profile vocabulary spells it: itself if listed, else without its backend (`local:cot`
    is `cot`); the caller decides what an unknown name means."""
    return name if name in vocabulary else without_backend(name)


def names(profiles: Sequence[AgentProfile] | None) -> list[str] | None:
    """The compact names (stored settings, reports); None without profiles."""
    return None if profiles is None else [p.name for p in profiles]
