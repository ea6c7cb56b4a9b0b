"""The command-line flags the CLIs share, declared once: the backend (`add_backend_args`), the debate
(`add_debate_args`), the questions (`add_question_args`), the trained policy (`add_policy_args`,
`add_checkpoint_args`) and the output (`add_output_args`).

Each function adds its flags to a titled argument group, so `--help` shows them together, with one name, type and
help text everywhere. A CLI whose default differs passes its own; `OMIT` leaves out a flag the CLI does not have,
`REQUIRED` makes one mandatory; a `*_note` is appended to the shared help text. The help lists the accepted values
where they are a closed set: backend specs (dear.llm.registry), tasks (dear.tasks), exchange layouts and
speculative-decoding types, reply styles. A flag has one name: the old `--agents` and `--rounds` are gone
(CHANGELOG.md); a mixed pool of agents is `--agent-profiles`.

In dear.debate (floor 2), not in dear/cli.py (floor 0), because the help lists values of floors 1 and 2;
dear/cli.py keeps the error path every CLI ends in."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Sequence
from pathlib import Path

from dear.debate.profiles import EXAMPLE, FORM, AgentProfile, parse_profiles
from dear.debate.prompts import LAYOUTS, STYLES
from dear.llm.local import SPECULATIVE_TYPES
from dear.llm.registry import SPECS, check_repeatable, check_spec
from dear.tasks import task_names

Group = argparse._ArgumentGroup  # what add_argument_group returns; argparse names it only privately


class Flag(enum.Enum):
    """A default that is not a value: the flag is left out, or must be given."""

    OMIT = "omit"
    REQUIRED = "required"


OMIT = Flag.OMIT
REQUIRED = Flag.REQUIRED


def _help(text: str, note: str = "", default: object = None) -> str:
    """The shared help `text`, then the CLI's `note`, then the default (when there is one)."""
    parts = [p.replace("%", "%%") for p in ([text, note] if note else [text])]  # argparse %-formats help
    shown = "" if default in (None, OMIT, REQUIRED) else " (default %(default)s)"
    return "; ".join(parts) + shown


def _add(group: Group, flag: str, default: object, help: str, **kwargs) -> None:
    """Add `flag` with `default`, unless it is OMIT; REQUIRED makes it mandatory."""
    if default is OMIT:
        return
    if default is REQUIRED:
        kwargs["required"] = True
    else:
        kwargs["default"] = default
    group.add_argument(flag, help=help, **kwargs)


def backend_specs() -> str:
    """The backend specs `--llm` accepts, as `--help` shows them."""
    return " | ".join(SPECS)


def _backend_spec(text: str) -> str:
    """--llm checked while the flags are parsed, before anything loads (each spec of a comma-separated per-agent
    list; the command checks the list's length)."""
    try:
        for spec in text.split(","):
            check_spec(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip()


def _agent_profiles(text: str) -> tuple[AgentProfile, ...]:
    """--agent-profiles checked while the flags are parsed (each profile's form, style, token limit and backend
    spec); the command checks the count against --n-agents (`n_agents_of`)."""
    try:
        return parse_profiles(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def n_agents_of(profiles: tuple[AgentProfile, ...] | None, n_agents: int | None) -> int | None:
    """V from --agent-profiles (one per agent) and --n-agents: either one, or both when they agree."""
    if profiles is None:
        return n_agents
    if n_agents is not None and n_agents != len(profiles):
        raise ValueError(f"--agent-profiles lists {len(profiles)} agents but --n-agents is {n_agents}; give one "
                         f"profile per agent (or leave out --n-agents)")
    return len(profiles)


def add_backend_args(parser: argparse.ArgumentParser, *, llm: str | None | Flag = "local", llm_note: str = "",
                     max_tokens: int | Flag = 512, max_tokens_note: str = "",
                     parallel: int | None | Flag = None, parallel_note: str = "",
                     n_ctx: int | None | Flag = None, speculative: bool = False, speculative_note: str = "",
                     agent_profiles: bool = False, sim_world: bool = False,
                     repeatable: bool | None | Flag = OMIT, repeatable_note: str = "") -> Group:
    """--llm, --max-tokens, the llama.cpp settings --parallel, --n-ctx, --speculative (the last on request),
    --repeatable/--no-repeatable (unless OMIT; None = on unless --parallel asks for slots, `repeatable_of`),
    --agent-profiles (on request) and the simulated backend's world, --sim-params and --sim-text-bank (on
    request; a train config's `llm.options.params_file` and `text_bank`)."""
    group = parser.add_argument_group("backend")
    _add(group, "--llm", llm, _help(f"backend spec (dear.llm.registry): {backend_specs()}", llm_note, llm),
         type=_backend_spec)
    _add(group, "--max-tokens", max_tokens, _help("completion tokens per model reply", max_tokens_note, max_tokens),
         type=int)
    _add(group, "--parallel", parallel, _help("llama.cpp parallel slots of a local/smoke backend", parallel_note,
                                              parallel), type=int)
    _add(group, "--n-ctx", n_ctx, _help("llama.cpp context tokens per slot of a local/smoke backend", "", n_ctx),
         type=int)
    if speculative:
        group.add_argument("--speculative", choices=SPECULATIVE_TYPES,
                           help=_help("llama.cpp draftless speculative decoding (local/smoke): the same answers, "
                                      "faster when replies repeat their context", speculative_note))
    if repeatable is not OMIT:
        group.add_argument("--repeatable", action=argparse.BooleanOptionalAction, default=repeatable,
                           help=_help("llama.cpp (local/smoke) decodes one request at a time, without prompt-cache "
                                      "reuse, so a seed gives the same texts whatever the machine's load (same "
                                      "machine, model and thread count); slower than parallel slots. A no-op for "
                                      "sim and bank, refused for openai and vllm", repeatable_note))
    if agent_profiles:
        group.add_argument("--agent-profiles", type=_agent_profiles, metavar="PROFILES",
                           help=_help(f"one profile per agent (a mixed pool), comma-separated {FORM}: BACKEND a "
                                      f"--llm spec (default --llm), STYLE one of {', '.join(STYLES)} (direct = the "
                                      f"final answer alone, no reasoning; pot = a Python program that prints the "
                                      f"answer, run in a sandbox), MAX_TOKENS the agent's completion limit "
                                      f"(default --max-tokens); e.g. {EXAMPLE}; one per agent"))
    if sim_world:
        group.add_argument("--sim-params", metavar="FILE",
                           help="the sim backend's world: a SimParams JSON, e.g. a fitted world's "
                                "worlds/gsm8k-mixed/sim_params_synthetic_texts.json (default: the built-in world)")
        group.add_argument("--sim-text-bank", metavar="FILE",
                           help="the sim backend's text bank (a fitted world's text_bank.json.gz): real "
                                "completions its agents write")
    return group


def repeatable_of(asked: bool | None, specs: Sequence[str], parallel: int | None = None,
                  parallel_flag: str = "--parallel") -> bool:
    """Whether the llama.cpp backends among `specs` decode repeatably (`LocalLlamaBackend(repeatable=True)`, one
    slot): `asked` is --repeatable (True), --no-repeatable (False) or neither (None: on, unless `parallel`, the
    slots `parallel_flag` asks for, is more than one). ValueError when --repeatable meets more than one slot or a
    backend that cannot repeat (`check_repeatable`)."""
    if asked is None:
        return not (parallel and parallel > 1)
    if asked:
        if parallel and parallel > 1:
            setting = f"{parallel_flag}{parallel}" if parallel_flag.endswith("=") else f"{parallel_flag} {parallel}"
            raise ValueError(f"{setting} decodes requests together, --repeatable one at a time; give one of them")
        check_repeatable(specs)
    return bool(asked)


def add_debate_args(parser: argparse.ArgumentParser, *, n_agents: int | None | Flag = 3, n_agents_note: str = "",
                    n_rounds: int | None | Flag = 2, n_rounds_note: str = "", sampling: bool = False,
                    sampling_note: str = "", layout: str | None | Flag = OMIT, layout_note: str = "",
                    seed: int | Flag = 0, seed_note: str = "") -> Group:
    """--n-agents, --n-rounds, --temperature and --top-p (with `sampling`), --layout and --seed."""
    group = parser.add_argument_group("debate")
    _add(group, "--n-agents", n_agents, _help("debating agents V", n_agents_note, n_agents), type=int)
    _add(group, "--n-rounds", n_rounds, _help("exchange rounds R after round 0", n_rounds_note, n_rounds), type=int)
    if sampling:
        group.add_argument("--temperature", type=float, default=0.7,
                           help=_help("sampling temperature", sampling_note, 0.7))
        group.add_argument("--top-p", type=float, default=0.9, help=_help("sampling top-p", sampling_note, 0.9))
    _add(group, "--layout", layout, _help("exchange-round prompt layout: multiturn (Du et al.'s growing "
                                          "conversation, KV-cache reuse) or single (one fresh message a round)",
                                          layout_note, layout), choices=LAYOUTS)
    _add(group, "--seed", seed, _help("seed of the debates' sampling and tie-breaks", seed_note, seed), type=int)
    return group


def add_question_args(parser: argparse.ArgumentParser, *, task: str | Flag = "gsm8k", benchmarks: bool = False,
                      split: str | None | Flag = None, split_note: str = "", n: int | Flag = OMIT,
                      n_note: str = "", data_seed: int | Flag = OMIT, data_seed_note: str = "") -> Group:
    """--task (or, with `benchmarks`, the comma-separated --benchmarks), --split, --n and --data-seed."""
    group = parser.add_argument_group("questions")
    names = ", ".join(task_names())
    if benchmarks:
        group.add_argument("--benchmarks", required=True, help=f"comma-separated task names: {names}")
    else:
        _add(group, "--task", task, _help(f"task: {names}", "", task))
    when_omitted = "the task's default when omitted" if split is None else ""
    _add(group, "--split", split, _help("dataset split", split_note or when_omitted, split))
    _add(group, "--n", n, _help("questions", n_note, n), type=int)
    _add(group, "--data-seed", data_seed, _help("seed that picks the questions", data_seed_note, data_seed),
         type=int)
    return group


def _add_encoder_args(group: Group, source: str) -> None:
    """--encoder and --allow-encoder-mismatch; `source` names what holds the trained encoder spec."""
    group.add_argument("--encoder", help=f"override the {source}'s encoder spec (needs --allow-encoder-mismatch)")
    group.add_argument("--allow-encoder-mismatch", action="store_true",
                       help="run with an --encoder other than the one the policy was trained with")


def add_policy_args(parser: argparse.ArgumentParser, *, shipped: Path) -> Group:
    """--policy (an exported policy; default: the `shipped` one), --encoder, --allow-encoder-mismatch."""
    group = parser.add_argument_group("policy")
    group.add_argument("--policy", default=str(shipped),
                       help="exported policy dir (python -m dear.export RUN OUT); default: the shipped policy "
                            f"{shipped.name} (trained in the simulator fitted to real debates)")
    _add_encoder_args(group, "policy")
    return group


def add_checkpoint_args(parser: argparse.ArgumentParser, *, checkpoint_note: str = "") -> Group:
    """--checkpoint (a training run, a checkpoint or an exported policy), --encoder, --allow-encoder-mismatch."""
    group = parser.add_argument_group("policy")
    group.add_argument("--checkpoint", help=_help("training run dir, checkpoint dir or exported policy",
                                                  checkpoint_note))
    _add_encoder_args(group, "checkpoint")
    return group


def add_output_args(parser: argparse.ArgumentParser, *, out_help: str, out: str | None | Flag = None,
                    path: bool = False, report_only: str = "", verbose: bool = False) -> Group:
    """--out (a Path with `path`), --report-only (when its help `report_only` is given) and -v/--verbose."""
    group = parser.add_argument_group("output")
    _add(group, "--out", out, _help(out_help, "", out), **({"type": Path} if path else {}))
    if report_only:
        group.add_argument("--report-only", action="store_true", help=report_only)
    if verbose:
        group.add_argument("-v", "--verbose", action="store_true",
                           help="log progress, and show the traceback of an error")
    return group
