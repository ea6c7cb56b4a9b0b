"""`python -m dear.serve`: serve DEAR-regulated debates as an OpenAI-compatible chat model (uvicorn)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from dear import tasks
from dear.cli import USER_ERRORS
from dear.cli import run as run_cli
from dear.debate.cli_args import OMIT, add_backend_args, add_debate_args, add_policy_args, repeatable_of
from dear.debate.methods import SERVED
from dear.debate.profiles import AgentProfile, backend_specs, on_backend
from dear.export import SHIPPED_POLICY, ExportError, choose_encoder, load_exported
from dear.infer import RegulatedDebater, refuse_pot_on_sim
from dear.llm.registry import uses_llama_cpp
from dear.serve import __doc__ as package_doc
from dear.serve.app import DEFAULT_MAX_BODY_SIZE, SYNTHETIC_ANSWERS, ServeSettings, create_app, synthetic_example
from dear.serve.methods import served_names
from dear.serve.scheduler import DebateScheduler


def _llm_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--llm-option needs KEY=VALUE, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)  # 0 -> int, 0.5 -> float, true -> bool, text stays text
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"--llm-option {text!r}: unreadable value: {e}") from None


PROG = "python -m dear.serve"
API_KEY_ENV = "DEAR_API_KEY"


_SIZE = re.compile(r"\s*(\d+)\s*(k|m|g)?(?:i?b)?\s*", re.I)


def _byte_size(text: str) -> int:
    """A size in bytes: 4194304, or with a binary suffix: 64KiB, 4MiB, 1GiB (also K, M, G)."""
    m = _SIZE.fullmatch(text)
    if m is None or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"need a size of at least 1 byte such as 4194304 or 4MiB, got {text!r}")
    return int(m.group(1)) * 1024 ** (" kmg".index((m.group(2) or " ").lower()))


def exposed(host: str) -> bool:
    """Whether binding `host` makes the server reachable from other machines (anything but loopback)."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to something other than loopback, as far as we know
        return True


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning printed at start when the server listens beyond loopback without an API key."""
    if api_key or not exposed(host):
        return None
    where = "all interfaces" if host in ("0.0.0.0", "::", "") else host
    return (f"warning: listening on {where} without an API key: anyone who can reach this port can run "
            f"debates on this machine's backend; set {API_KEY_ENV} (or --api-key) to require "
            f"'Authorization: Bearer <key>'")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=package_doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_args(p, shipped=SHIPPED_POLICY)
    backend = add_backend_args(p, parallel=OMIT, n_ctx=OMIT, agent_profiles=True, repeatable=False,
                               repeatable_note="off by default: concurrent debates share parallel slots, faster")
    backend.add_argument("--cache", help="SQLite response cache")
    backend.add_argument("--llm-option", action="append", type=_llm_option, default=[], metavar="KEY=VALUE",
                         help="keyword argument for the backend (repeat), e.g. n_parallel=8, max_retries=1")
    add_debate_args(p, n_agents=OMIT, n_rounds=None, n_rounds_note="default: the policy's training setting",
                    sampling=True, sampling_note="round 0 (the policy sets the later rounds)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: the "
                        f"{API_KEY_ENV} environment variable, which other users cannot read from the process "
                        f"list; unset: no key)")
    p.add_argument("--max-body-size", type=_byte_size, default=DEFAULT_MAX_BODY_SIZE, metavar="BYTES",
                   help="largest request body accepted, in bytes or with a suffix such as 64KiB or 4MiB; "
                        "larger ones get 413 (default 4MiB)")
    p.add_argument("--model-name", default="dear",
                   help=f"the model name clients send for DEAR (default dear; the other methods, "
                        f"{', '.join(SERVED)}, keep theirs)")
    p.add_argument("--kind", default="numeric", choices=tasks.KINDS,
                   help="answer kind when a request names none (default numeric)")
    p.add_argument("--max-active", type=int, default=32, help="debates in flight (batched per engine step)")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond that; more get 429")
    p.add_argument("--batch-window-ms", type=float, default=10.0,
                   help="an idle server waits this long for more requests to batch with the first")
    p.add_argument("--backend-retry-s", type=float, default=5.0,
                   help="while the backend cannot be built, retry at most this often (requests get 503)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    a = p.parse_args(argv)
    try:
        served_names(a.model_name)
    except ValueError as e:
        p.error(f"--model-name: {e}")
    if a.max_active < 1 or a.max_queue < 1:
        p.error("--max-active and --max-queue must be >= 1")
    if a.api_key is not None:
        a.api_key = a.api_key.strip()
        if not a.api_key:
            p.error(f"--api-key / {API_KEY_ENV} is empty")
    return a


def checked_profiles(a: argparse.Namespace, n_agents: int) -> tuple[AgentProfile, ...] | None:
    """--agent-profiles checked against the policy's V agents before anything loads (each profile's form and
    backend spec were checked while the flags were parsed)."""
    profiles = a.agent_profiles
    if profiles is None:
        return None
    if "," in a.llm:
        raise ValueError("--llm must be one spec with --agent-profiles (the backend of profiles that name none)")
    if len(profiles) != n_agents:
        raise ValueError(f"--agent-profiles lists {len(profiles)} agents but the policy {a.policy} debates with "
                         f"V={n_agents}; give one profile per agent")
    refuse_pot_on_sim(on_backend(profiles, a.llm), a.llm, a.llm)  # the synthetic debaters write no programs
    return profiles


def backend_options(a: argparse.Namespace, n_agents: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `--llm` backend's options, and those of the llama.cpp backends agent profiles name besides it: one slot
    decoding repeatably (--repeatable), else one slot per agent turn of a full batch (at most 16)."""
    options = dict(a.llm_option)
    specs = backend_specs(on_backend(a.agent_profiles, a.llm)) if a.agent_profiles else [a.llm]
    repeatable = repeatable_of(a.repeatable, specs, options.get("n_parallel"), "--llm-option n_parallel=")
    llama: dict[str, Any] = ({"n_parallel": 1, "repeatable": True} if repeatable
                             else {"n_parallel": max(1, min(16, a.max_active * n_agents))})
    if uses_llama_cpp(a.llm) and repeatable:  # one request at a time (dear.llm.local)
        options.update(llama)
    elif uses_llama_cpp(a.llm):
        options.setdefault("n_parallel", llama["n_parallel"])
    return options, llama


def serve_app(a: argparse.Namespace) -> tuple[Any, list[str]]:
    """The server `a` asks for, its backend connected (a backend that is down gives 503s), and the lines to print
    before it listens: an exposure warning, where it serves and, on the synthetic backend, what it answers."""
    try:
        exported = load_exported(a.policy)
    except ExportError as e:
        raise ExportError(f"--policy: {e}") from e
    try:  # refused here, before the server starts, not on the first request
        choose_encoder(exported.encoder, a.encoder, a.allow_encoder_mismatch)
    except ValueError as e:
        raise ValueError(f"--encoder: {e}") from e
    profiles = checked_profiles(a, exported.n_agents)
    options, llama = backend_options(a, exported.n_agents)

    def build() -> RegulatedDebater:
        return RegulatedDebater(exported, a.llm, n_rounds=a.n_rounds, max_tokens=a.max_tokens,
                                temperature=a.temperature, top_p=a.top_p, seed=a.seed, encoder=a.encoder,
                                cache=a.cache, allow_encoder_mismatch=a.allow_encoder_mismatch,
                                agent_profiles=profiles, profile_options=None if uses_llama_cpp(a.llm) else llama,
                                **options)

    scheduler = DebateScheduler(build, max_active=a.max_active, max_queue=a.max_queue,
                                batch_window_s=a.batch_window_ms / 1000, retry_s=a.backend_retry_s)
    scheduler.connect()  # load the backend before listening; a backend that is down gives 503s
    app = create_app(scheduler, ServeSettings(model_name=a.model_name, default_kind=a.kind, api_key=a.api_key,
                                              max_body_size=a.max_body_size))
    lines = []
    warning = exposure_warning(a.host, a.api_key)
    if warning:
        lines.append(warning)
    agents = f", agents {', '.join(p.name for p in on_backend(profiles, a.llm))}" if profiles else ""
    lines.append(f"serving {a.model_name!r} (policy {a.policy}, llm {a.llm}{agents}) on http://{a.host}:{a.port}/v1"
                 f"{' (API key required)' if a.api_key else ''}")
    if scheduler.synthetic:
        lines.append(f"{SYNTHETIC_ANSWERS}; e.g.: {synthetic_example()!r}")
    return app, lines


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    a = parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    app, lines = serve_app(a)
    for line in lines:
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG, errors=(*USER_ERRORS, ExportError))
