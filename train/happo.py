"""HAPPO trainer for DEAR: `python -m train.happo --config gsm8k|smoke|sim|PATH.yaml [key.sub=value ...]`.

    python -m train.happo --config gsm8k                       # embedded Qwen on GSM8K train, local Ray
    python -m train.happo --config smoke                       # tiny real-model run (minutes)
    python -m train.happo --config sim run.iterations=50       # synthetic debaters (labelled synthetic)
    python -m train.happo --resume runs/RUN_DIR                # continue exactly where it stopped
    python -m train.happo --config gsm8k --ray-address auto    # join an existing Ray cluster

The learner (HAPPO update) runs in the driver; rollouts run on Ray actors (`rollout.num_workers`, 0 =
in-process). Every scalar goes to RUN_DIR/metrics.{csv,jsonl}; checkpoints to RUN_DIR/checkpoints/.

Failed debates. A debate fails when one of its LLM requests fails after the backend's retries
(`Completion.error`); the engine ends it there. It is *excluded from the update*: its whole row of transitions
is dropped from the iteration's batch, so its reward (a failed debate would count as wrong) and its partial
rounds reach neither the advantages, the value targets nor the value normaliser, and the rollout metrics
(accuracy, reward, tokens, HCR/BCR) are computed over the finished debates only. `rollout/failed_debates`
counts the excluded debates of the iteration (`charts/failed_debates_total` over the run). An iteration in
which every debate failed makes no update and writes no checkpoint: training stops with exit code 1 and one
error line that names the backend.

Run directories. `--run-dir` of an existing run refuses unless `--overwrite` (which first removes the old
run's checkpoints, partial chunks and logs); `--resume RUN_DIR` continues a run (with dotted overrides only,
never `--config`) and changes nothing on disk until its checkpoint loaded and its backend started. Debates
finished in an interrupted iteration are kept in RUN_DIR/partial/ (train/partial.py), and so are the model calls
that returned in its chunks still running (train/call_log.py): `--resume` reuses the debates and replays the
calls. An interrupted run's last lines say what it kept (or that nothing of the iteration had finished) and give
the exact `--resume` command.

llama.cpp threads. A local or smoke backend decodes with `llm.threads` threads: set at the start of a run
(DEAR_LLAMA_THREADS, else every usable core, never fewer because the machine is busy) and recorded in the run's
config.yaml, so `--resume` decodes with the same count; the texts of a seed depend on it.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Sequence

import yaml

from dear.cli import USER_ERRORS, command_line
from dear.cli import run as run_cli
from dear.llm.base import BackendError
from train.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    config_names,
    help_epilog,
    load_config,
)
from train.runner import Trainer, TrainingError  # the CLI over train.runner


PROG = "python -m train.happo"
# Refused at start-up (bad input, damaged files, an unreachable backend): one line, exit code 2. The config,
# run-directory and integrity errors are ValueErrors, so USER_ERRORS holds them.
ERRORS = (*USER_ERRORS, BackendError)
CODES = {TrainingError: 1}  # training stopped by an error (every debate of an iteration failed): exit code 1


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps option help at spaces only, so a config name such as `sim-state-dependent` stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; the module docstring is its `--help`."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog=help_epilog(),
                                formatter_class=_HelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="show the traceback of an error")
    p.add_argument("--config", help=f"{' | '.join(config_names())} | path/to/config.yaml")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    p.add_argument("--ray-address", default=None, help="join an existing Ray cluster (e.g. 'auto' or host:port)")
    p.add_argument("--run-dir", default=None, help="explicit run directory (default: run.out_dir/NAME-...)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow --run-dir to name an existing run: its checkpoints and logs are removed first")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.episodes_per_iter=8")
    args = p.parse_args(argv)
    if not args.config and not args.resume:
        p.error("give --config NAME_OR_PATH or --resume RUN_DIR")
    if args.config and args.resume:
        p.error("--config cannot be combined with --resume: a resumed run keeps its own config.yaml "
                "(change single keys with dotted overrides, e.g. run.iterations=400)")
    if args.resume and (args.run_dir or args.overwrite):
        p.error("--resume RUN_DIR names the run directory; it cannot be combined with --run-dir or --overwrite")
    return args


def build_config(args: argparse.Namespace) -> TrainConfig:
    """The run's config: a resumed run's own config.yaml with the dotted overrides, or
    `--config` with them."""
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not Path(args.resume).is_dir():
            raise FileNotFoundError(f"--resume {args.resume}: no such run directory")
        if not saved.exists():
            raise FileNotFoundError(f"--resume {args.resume}: no config.yaml in the run directory")
        try:
            data = yaml.safe_load(saved.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ConfigError(f"{saved}: cannot be parsed (damaged?): {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{saved}: top level must be a mapping")
        data = apply_overrides(data, list(args.overrides))  # e.g. run.iterations=400 to extend a run
        return config_from_dict(data, f"{saved}: ")
    return load_config(args.config, list(args.overrides))


def main(argv: Sequence[str] | None = None) -> int:
    """Train (or resume) one run; exit code 0 done, 130 interrupted. A refusal at start-up raises one of ERRORS
    (exit code 2 through dear.cli.run), a training stopped by an error TrainingError (exit code 1)."""
    args = parse_args(argv)
    cfg = build_config(args)
    trainer = Trainer(cfg, run_dir=Path(args.resume or args.run_dir) if (args.resume or args.run_dir) else None,
                      resume=bool(args.resume), ray_address=args.ray_address, overwrite=args.overwrite)
    trainer.logger.write(trainer.start_message())
    try:
        result = trainer.train()
    finally:
        trainer.close()
    trainer.logger.write(f"done: {result.iterations} iterations, {result.global_step} env steps"
                         f"{' (interrupted)' if result.interrupted else ''}; run dir {result.run_dir}")
    for line in trainer.exit_lines(result, resume_command(result.run_dir, args.ray_address)):
        trainer.logger.write(line)
    return 130 if result.interrupted else 0


def resume_command(run_dir: Path, ray_address: str | None = None) -> str:
    """The command that continues the run in `run_dir` (its config.yaml holds every override it started with)."""
    return command_line(PROG, ["--resume", str(run_dir), *(["--ray-address", ray_address] if ray_address else [])])


if __name__ == "__main__":
    run_cli(main, PROG, errors=ERRORS, codes=CODES)
