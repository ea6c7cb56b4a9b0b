"""What a trained policy's selection learned, by profile: the share of ordered pairs (reader, read) that it reads,
grouped by the reader's and the read agent's profiles (in a pool without profiles, by seat), per exchange round.

    python -m train.read_rates RUN_DIR [--episodes 128] [--seed 1000] [KEY=VALUE ...]

It plays `--episodes` test-split debates of the run's own world (its saved config.yaml, with overrides) under the
run's latest checkpoint, acting deterministically as the evaluation does (a pair is read when its probability
exceeds 0.5), and counts, after each round, which pairs the policy chose to read, with the mean probability it
gave them (what a sampled policy would read). With shuffled seating a profile is followed from seat to seat (the
debate's pool order). Every number is from the run's world: synthetic for a simulated one. Prints a Markdown table;
`--json` writes the counts too.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from dear.atomic import write_json
from dear.cli import run as run_cli
from dear.export import load_actors
from dear.read_rates import ReadCounter, ReadRate, table
from train.build import make_local_backend, make_policy, make_vector_env
from train.checkpoint import latest_checkpoint
from train.config import TrainConfig, load_config

PROG = "python -m train.read_rates"


def load_run_policy(run_dir: Path, cfg: TrainConfig):
    """The run's policy with the weights of its latest checkpoint, in evaluation mode."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir}: no checkpoint (checkpoints/iter_*) to read")
    weights = load_file(str(ckpt / "model.safetensors"))
    return load_actors(make_policy(cfg), weights, f"{ckpt}: {{part}} weights do not fit {run_dir / 'config.yaml'}").eval()


def read_rates(cfg: TrainConfig, policy, episodes: int, seed: int) -> list[ReadRate]:
    """Deterministic reads of `policy` over `episodes` test-split debates of `cfg`'s world (seeded by `seed`)."""
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, split="test"),
                              rollout=dataclasses.replace(cfg.rollout, envs_per_worker=episodes))
    backend = make_local_backend(cfg)
    venv = make_vector_env(cfg, backend)
    names = [p.name for p in venv.config.agent_profiles] if venv.config.agent_profiles else None
    counter = ReadCounter(cfg.env.n_agents)
    try:
        obs, _ = venv.reset(seed=[seed + k for k in range(episodes)])
        with torch.no_grad():
            for r in range(1, cfg.env.n_rounds + 1):
                selection = torch.from_numpy(obs["selection"])
                act = policy.act(selection, torch.from_numpy(obs["belief"]), torch.from_numpy(obs["uncertainty"]),
                                 deterministic=True)
                masks = act.mask.numpy()
                # P(read) of each pair; the extended action set's pairs are conditional on a revise, so none
                p = (policy.selection.distribution(selection).base_dist.probs.numpy() if not policy.extended
                     else np.full((episodes, len(counter.order)), np.nan))
                for d, debate in enumerate(venv.debates):
                    who = [names[debate.pool_index(i)] if names else f"seat {i}" for i in range(cfg.env.n_agents)]
                    counter.add(r, who, masks[d], p[d])
                obs, *_ = venv.step(act.env_action())
    finally:
        venv.close()
        backend.close()
    return counter.rates()


def markdown(rates: Sequence[ReadRate], run_dir: Path, episodes: int, seed: int) -> str:
    lines = [f"Read rates of `{run_dir}` (latest checkpoint, deterministic, {episodes} test-split debates from seed "
             f"{seed}; rate = share of the pairs read, P(read) = the selection's mean probability for them):", "",
             *table(rates)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a training run directory (config.yaml + checkpoints/)")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides (e.g. a moved world file)")
    ap.add_argument("--episodes", type=int, default=128, help="test-split debates (default 128)")
    ap.add_argument("--seed", type=int, default=1000, help="debate k is seeded seed + k (default 1000)")
    ap.add_argument("--json", help="also write the counts to this file")
    a = ap.parse_args(argv)
    if a.episodes < 1:
        ap.error("--episodes must be >= 1")
    run_dir = Path(a.run_dir)
    if not (run_dir / "config.yaml").exists():
        ap.error(f"{run_dir} has no config.yaml: give a training run directory")
    cfg = load_config(str(run_dir / "config.yaml"), [*a.overrides, "logging.progress=false"])
    rates = read_rates(cfg, load_run_policy(run_dir, cfg), a.episodes, a.seed)
    print(markdown(rates, run_dir, a.episodes, a.seed))
    if a.json:
        write_json(a.json, [dict(dataclasses.asdict(x), rate=x.rate) for x in rates], indent=1, trailing_newline=True)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
