"""What an extended policy does after each round-0 state, on real traces and in a simulated world (SYNTHETIC).

    python -m simworld.policy_states --traces results/eval-gsm8k-n60-extended/traces/gsm8k/dear.jsonl \\
        --policy results/policy-sim-fitted-extended-v2 --world configs/sim.yaml --sim-questions 600

Round 0's three answers are unanimous, two agree, or all differ (`agreement_state`); a regulator that knows when
more samples pay draws them where the answers differ. Per state: debates, the fresh samples drawn after round 0
(mean, and the share of debates with none), exchange rounds run, and accuracy (ties as expected values). The real
side reads `--traces` (an eval.run trace file of the policy); the simulated side runs `--policy` in `--world` (its
sim parameters and text bank) on `--sim-questions` test-split synthetic questions from `--seed`, with the policy's
encoder, silent turns and decision rule, and is labelled synthetic. Compare with the value of sampling per state in
`simworld.sampling_validation`'s table by round-0 agreement.

With `--baselines DIR` (an eval.run traces directory of the same benchmark, e.g.
results/eval-gsm8k-n60-v2/traces/gsm8k) a second table gives, per round-0 state, the accuracy of the fixed methods
stored there (round-0 majority, MAD, SC, adaptive SC until 2 agree) and, with `--policy`, of the same protocols in
the simulated world `--world` on the same simulated questions (synthetic): what revising and what fresh samples are worth
after each state, real against simulated.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from dear import tasks
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.sampling_rules import AGREEMENT_STATES, ROUND0_AGENTS, agreement_of
from dear.debate.trace import DebateTrace, read_jsonl

PROG = "python -m simworld.policy_states"
STATES = AGREEMENT_STATES


@dataclass(frozen=True)
class StateRow:
    state: str
    debates: int
    fresh: float  # fresh samples drawn after round 0, mean over the state's debates
    no_fresh: float  # share of the state's debates that drew none
    rounds: float  # exchange rounds run, mean
    accuracy: float  # final score, ties as expected values


def agreement_state(trace: DebateTrace) -> str:
    """How round 0's first three answers agree (a 9-sample SC trace counts its debate's round 0): unanimous, two
    agree, or all differ (`agreement_of`)."""
    return agreement_of([t.answer_key for t in trace.rounds[0][:ROUND0_AGENTS]])


def by_state(traces: Sequence[DebateTrace]) -> list[StateRow]:
    """One row per state present among the finished traces."""
    rows = []
    for state in STATES:
        group = [t for t in traces if not t.failed and t.rounds and agreement_state(t) == state]
        if not group:
            continue
        fresh = np.array([sum(x.fresh for turns in t.rounds[1:] for x in turns) for t in group])
        rows.append(StateRow(state, len(group), float(fresh.mean()), float(np.mean(fresh == 0)),
                             float(np.mean([len(t.rounds) - 1 for t in group])),
                             float(np.mean([t.final_score for t in group]))))
    return rows


def sim_traces(policy: Path, world: Path, n: int, seed: int) -> list[DebateTrace]:
    """The exported policy's debates in a simulated world (SYNTHETIC), as eval.run would regulate them."""
    from dear.evidence import make_encoder
    from dear.export import load_exported
    from dear.llm.registry import make_backend
    from dear.regulator import CertaintyWeigher, RegulatedProtocol

    cfg = yaml.safe_load(world.read_text())
    if (cfg.get("llm") or {}).get("preset") != "sim":
        raise ValueError(f"--world {world}: llm.preset is not sim")
    exported = load_exported(policy)
    encoder = make_encoder(exported.encoder)
    env = cfg.get("env") or {}
    config = DebateConfig(n_agents=exported.n_agents, n_rounds=exported.n_rounds or 2,
                          max_tokens=cfg["llm"].get("max_tokens", 512), seed=seed, silent=exported.silent,
                          decision=exported.decision)
    engine = DebateEngine(make_backend("sim", **(cfg["llm"].get("options") or {})), config,
                          weigher=CertaintyWeigher(encoder, exported.answer_aware))
    protocol = RegulatedProtocol(exported.policy, encoder, config, answer_aware=exported.answer_aware)
    questions = tasks.load(env.get("task", "synthetic"), split="test", n=n, seed=seed)
    return [d.trace for d in engine.run(questions, protocol)]


# The fixed methods of the baseline table: eval.run's trace name -> the protocol that plays it in the sim.
BASELINES = {"majority": "round-0 majority", "mad": "MAD (revise, full mesh)", "sc": "SC (9 samples)",
             "adaptive-sc-2": "adaptive SC (until 2 agree)"}


def accuracy_by_state(traces: Sequence[DebateTrace]) -> dict[str, tuple[int, float]]:
    """Per round-0 state (of the first three answers): (debates, accuracy with ties as expected values)."""
    out = {}
    for state in STATES:
        scores = [t.final_score for t in traces if not t.failed and t.rounds and agreement_state(t) == state]
        if scores:
            out[state] = (len(scores), float(np.mean(scores)))
    return out


def real_baselines(directory: Path) -> dict[str, list[DebateTrace]]:
    """The baseline methods' traces an eval.run traces directory holds (those it lacks are left out)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"--baselines: no such directory {directory}")
    found = {m: read_jsonl(directory / f"{m}.jsonl") for m in BASELINES if (directory / f"{m}.jsonl").exists()}
    if not found:
        raise FileNotFoundError(f"--baselines: {directory} holds none of {', '.join(f'{m}.jsonl' for m in BASELINES)}")
    return found


def sim_baselines(world: Path, n: int, seed: int) -> dict[str, list[DebateTrace]]:
    """The baseline protocols in a simulated world (SYNTHETIC) on `n` test-split questions: V = 3, R = 2, round-0
    sampling (T 0.7, top-p 0.9), silent turns."""
    from dear.debate.protocols import SamplingRuleProtocol, SelfConsistencyProtocol, make_protocol
    from dear.llm.registry import make_backend

    cfg = yaml.safe_load(world.read_text())
    if (cfg.get("llm") or {}).get("preset") != "sim":
        raise ValueError(f"--world {world}: llm.preset is not sim")
    questions = tasks.load((cfg.get("env") or {}).get("task", "synthetic"), split="test", n=n, seed=seed)
    config = DebateConfig(n_agents=3, n_rounds=2, max_tokens=cfg["llm"].get("max_tokens", 512), seed=seed,
                          silent=True)
    protocols = {"majority": make_protocol("majority", config), "mad": make_protocol("mad", config),
                 "sc": SelfConsistencyProtocol(3, 9), "adaptive-sc-2": SamplingRuleProtocol("adaptive-sc-2", 3, 9)}
    out = {}
    for method in BASELINES:  # a fresh backend each: every protocol starts from the same round 0
        engine = DebateEngine(make_backend("sim", **(cfg["llm"].get("options") or {})), config)
        out[method] = [d.trace for d in engine.run(questions, protocols[method])]
    return out


def baseline_table(real: dict[str, list[DebateTrace]], sim: dict[str, list[DebateTrace]] | None) -> list[str]:
    """Accuracy (%) and debates per round-0 state for each baseline, real then simulated (synthetic)."""
    lines = ["| method | side | " + " | ".join(STATES) + " |", "|---|---|" + "---:|" * len(STATES)]
    for method, label in BASELINES.items():
        for side, traces in (("real", real.get(method)), ("sim (synthetic)", (sim or {}).get(method))):
            if traces is None:
                continue
            acc = accuracy_by_state(traces)
            cells = [f"{100 * acc[s][1]:.1f} (n={acc[s][0]})" if s in acc else "–" for s in STATES]
            lines.append(f"| {label} | {side} | " + " | ".join(cells) + " |")
    return lines


def table(rows: Sequence[StateRow], side: str) -> list[str]:
    return [f"| {side} | {r.state} | {r.debates} | {r.fresh:.2f} | {100 * r.no_fresh:.0f} % | {r.rounds:.2f} | "
            f"{100 * r.accuracy:.1f} |" for r in rows]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=Path, help="an eval.run trace file of the policy (the real side)")
    p.add_argument("--policy", type=Path, help="an exported extended policy (the simulated side)")
    p.add_argument("--world", type=Path, default=Path("configs/sim.yaml"), help="the sim world (default %(default)s)")
    p.add_argument("--sim-questions", type=int, default=600, help="simulated questions (default %(default)s)")
    p.add_argument("--seed", type=int, default=99, help="the simulated side's question and debate seed")
    p.add_argument("--baselines", type=Path,
                   help="an eval.run traces directory: add the fixed methods' accuracy by round-0 state (real, and "
                        "with --policy in --world simulated)")
    p.add_argument("--out", type=Path, help="write the table here (markdown) as well")
    a = p.parse_args(argv)
    if a.traces is None and a.policy is None and a.baselines is None:
        p.error("give --traces, --policy, --baselines, or several")
    lines = [f"Command: `{command_line(PROG, argv)}`", "",
             "| side | round 0 | debates | fresh samples after round 0 | none drawn | exchange rounds | accuracy % |",
             "|---|---|---:|---:|---:|---:|---:|"]
    if a.traces is not None:
        if not a.traces.exists():
            raise FileNotFoundError(f"--traces: no such file {a.traces}")
        lines += table(by_state(read_jsonl(a.traces)), "real")
    if a.policy is not None:
        lines += table(by_state(sim_traces(a.policy, a.world, a.sim_questions, a.seed)), "sim (synthetic)")
    if a.baselines is not None:
        sim = sim_baselines(a.world, a.sim_questions, a.seed) if a.policy is not None else None
        where = (f"; sim: the same protocols in `{a.world}` on {a.sim_questions} simulated test questions from seed "
                 f"{a.seed}, synthetic" if sim is not None else "")
        lines += ["", f"Accuracy % by round-0 state of the fixed methods (real: the traces in `--baselines`{where}):",
                  "",
                  *baseline_table(real_baselines(a.baselines), sim)]
    text = "\n".join(lines) + "\n"
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
