"""`python -m eval.read_probabilities DIR`: what a DEAR policy's selection did on an evaluation's debates, by profile
— for each exchange round and each (reader, read) pair of profiles, the share of ordered pairs it read and the mean
probability it gave them (`dear.read_rates`, the table `python -m train.read_rates` prints for simulated debates).

    python -m eval.read_probabilities results/eval-gsm8k-mixed-n60 --checkpoint results/policy-sim-mixed

The regulator's log (`traces/<benchmark>/<method>.regulator.jsonl`) holds the beliefs and uncertainties the policy
saw before each round and the mask it chose; the probabilities are the policy's again on those inputs (the paper's
selection observation, with the profile one-hots when the policy observes profiles). The policy must be the one
that ran: its weights' sha256 is checked against the directory's run.json, and on a deterministic run of `dear`
every logged mask must be the mode of the rebuilt probabilities. Seats are named by the profiles the
traces record (else "seat i"). Policies whose selection also observes decision features, and the extended action
set (whose pairs are conditional on a turn kind), are refused.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from dear.atomic import write_json
from dear.cli import run as run_cli
from dear.debate.profiles import in_vocabulary
from dear.policy import JointPolicy, observes_decision, pairs_to_mask, profile_onehot, selection_observation
from dear.read_rates import ReadCounter, ReadRate, table
from eval.methods import load_checkpoint

PROG = "python -m eval.read_probabilities"


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise ValueError(f"{path}: no such file (did the method run in this directory?)")
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
    return rows


def seat_profiles(trace: dict, n_agents: int) -> list[str]:
    """Each seat's profile as the trace's round 0 records it ("seat i" without profiles)."""
    first = {t["agent"]: t for t in (trace.get("rounds") or [[]])[0]}
    return [first.get(i, {}).get("profile") or f"seat {i}" for i in range(n_agents)]


def selection_input(policy: JointPolicy, b: torch.Tensor, u: torch.Tensor, who: Sequence[str]) -> torch.Tensor:
    """The selection's input for one logged decision, as `dear.regulator.BeliefObservation.selection_input` builds
    it: the paper's observation, then the profile one-hots when the policy observes profiles."""
    obs = selection_observation(b[None], u[None])
    vocabulary = policy.config.profiles
    if vocabulary is None:
        return obs
    return torch.cat([obs, profile_onehot([[in_vocabulary(n, vocabulary) for n in who]], vocabulary)], dim=-1)


def read_probabilities(directory: Path, benchmark: str, method: str, policy: JointPolicy,
                       check_modes: bool = False) -> list[ReadRate]:
    """The read rates and probabilities of `method`'s debates of `benchmark` in an eval.run directory. With
    `check_modes` (a deterministic run of the learned selection) every logged mask must be the rebuilt
    probabilities' mode (p > 0.5), which shows the inputs were rebuilt as the policy saw them."""
    cfg = policy.config
    if cfg.actions != "paper" or observes_decision(cfg.actions, cfg.decision_features):
        raise ValueError("the policy's selection observes decision features (or plays the extended actions), which "
                         "the regulator's log does not hold; only the paper's observation (+ profiles) is rebuilt")
    traces = {t["debate_id"]: t for t in _jsonl(directory / "traces" / benchmark / f"{method}.jsonl")}
    log = directory / "traces" / benchmark / f"{method}.regulator.jsonl"
    counter = ReadCounter(policy.n_agents)
    with torch.no_grad():
        for lineno, row in enumerate(_jsonl(log), 1):
            trace = traces.get(row["debate_id"])
            if trace is None:
                raise ValueError(f"{log}:{lineno}: debate {row['debate_id']!r} has no trace in {method}.jsonl")
            who = seat_profiles(trace, policy.n_agents)
            for decision in row["decisions"]:
                b = torch.tensor(decision["b"], dtype=torch.float32)
                u = torch.tensor(decision["u"], dtype=torch.float32)
                probs = policy.selection.distribution(selection_input(policy, b, u, who)).base_dist.probs[0]
                if check_modes and _mode_mask(probs, policy.n_agents) != decision["mask"]:
                    raise ValueError(f"{log}:{lineno}: round {decision['round']}: the logged mask is not the mode "
                                     "of the rebuilt probabilities (is this the policy that ran?)")
                counter.add(int(decision["round"]), who, decision["mask"], probs.tolist())
    return counter.rates()


def _mode_mask(probs: torch.Tensor, n_agents: int) -> list[list[bool]]:
    return pairs_to_mask((probs > 0.5).float()[None], n_agents)[0].tolist()


def _run_settings(directory: Path) -> dict:
    run_json = directory / "run.json"
    if not run_json.is_file():
        raise ValueError(f"{directory}: no run.json (not an eval.run results directory)")
    return json.loads(run_json.read_text()).get("settings") or {}


def main(argv: Sequence[str] | None = None) -> list[ReadRate]:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", type=Path, help="an eval.run results directory")
    ap.add_argument("--checkpoint", help="the policy that ran (default: the one run.json names)")
    ap.add_argument("--benchmark", help="default: the directory's only benchmark")
    ap.add_argument("--method", default="dear", help="a DEAR method of the directory (default dear)")
    ap.add_argument("--json", type=Path, help="also write the rates to this file")
    a = ap.parse_args(argv)
    settings = _run_settings(a.directory)
    benchmarks = settings.get("benchmarks") or []
    if a.benchmark is None and len(benchmarks) != 1:
        ap.error(f"{a.directory} ran {benchmarks}: name one with --benchmark")
    benchmark = a.benchmark or benchmarks[0]
    path = a.checkpoint or settings.get("checkpoint")
    if not path:
        ap.error(f"{a.directory}/run.json names no checkpoint: give --checkpoint")
    ckpt = load_checkpoint(path)
    ran = settings.get("checkpoint_sha256")
    if ran and ckpt.sha256 != ran:
        raise ValueError(f"--checkpoint {path}: its weights (sha256 {ckpt.sha256[:12]}…) are not the ones "
                         f"{a.directory} ran ({ran[:12]}…)")
    deterministic = settings.get("policy_sampling", "deterministic") == "deterministic"
    rates = read_probabilities(a.directory, benchmark, a.method, ckpt.policy(),
                               check_modes=deterministic and a.method == "dear")
    print(f"Read rates of `{path}` on `{a.directory}` ({benchmark}, {a.method}; the masks it chose and the "
          "selection's mean probability for the pairs, from the regulator's log):\n")
    print("\n".join(table(rates)))
    if a.json:
        write_json(a.json, [dict(asdict(x), rate=x.rate) for x in rates], indent=1, trailing_newline=True)
    return rates


if __name__ == "__main__":
    run_cli(main, PROG)
