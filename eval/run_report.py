"""The report of an `eval.run` results directory: each method's results read from its traces (`Reporter.collect`),
then summary.md, summary.csv and the plots (`Reporter.report`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from dear.atomic import write_json
from dear.llm import registry
from dear.tasks.types import Question
from eval import methods as M
from eval import plots, report
from eval.results_dir import ROUND0, EvalSettings, ResultsDir, check_round0

log = logging.getLogger("eval")


@dataclass
class Collected:
    """A results directory's report inputs: each method's results, the debates still failed per
    (benchmark, method), the model ids in the traces, and the benchmarks whose round 0 was not stored."""

    results: list[report.MethodResult]
    failures: dict[tuple[str, str], list[tuple[str, str]]]
    model_ids: set[str]
    legacy: list[str]


class Reporter:
    """Reads a results directory's traces of `specs` over the questions `questions(benchmark)` names, and writes
    its report."""

    def __init__(self, settings: EvalSettings, specs: list[M.MethodSpec], ckpt: M.Checkpoint | None,
                 results: ResultsDir, questions: Callable[[str], list[Question]]):
        self.s, self.specs, self.ckpt, self.results, self.questions = settings, specs, ckpt, results, questions

    def label(self, spec: M.MethodSpec) -> str:
        """The report's label: DEAR methods carry the policy's training world, e.g. "DEAR (sim-trained)", and an
        extended policy's methods say so ("DEAR extended (sim-fitted)"), so a report that sets them beside the
        paper's DEAR on the same questions (`eval.combine`) tells the two apart; a policy that observes the agents'
        profiles says so too ("DEAR+profiles (sim-fitted)")."""
        if not spec.needs_checkpoint or self.ckpt is None:
            return spec.label
        name = spec.label
        if self.ckpt.extended:
            # its random control draws its stop and kinds too, not only a mask
            name = "DEAR extended random (action frequencies)" if spec.selection_mode == "random" \
                else name.replace("DEAR", "DEAR extended", 1)
        if self.ckpt.policy_config.profiles:
            name = name.replace("DEAR", "DEAR+profiles", 1)
        return f"{name} ({self.s.policy_world or self.ckpt.world})"

    def collect(self) -> Collected:
        """Every method's results over the questions every method finished, read from the traces; writes
        nothing. Raises when a method's round 0 differs from the stored one (the sharing every comparison
        relies on)."""
        collected = Collected([], {}, set(), [])
        for b in self.s.benchmarks:
            self._collect_benchmark(b, collected)
        if not collected.results:
            n_failed = sum(len(v) for v in collected.failures.values())
            raise ValueError(f"{self.s.out}: no finished debates to report"
                             + (f" ({n_failed} failed on backend errors; run the same command again to retry them)"
                                if n_failed else ""))
        for (b, m), items in collected.failures.items():
            if items:
                log.warning("%s/%s: %d failed debates remain (listed in summary.md; rerun the command to retry)",
                            b, m, len(items))
        return collected

    def _collect_benchmark(self, b: str, collected: Collected) -> None:
        """One benchmark's results, failures and model ids added to `collected`."""
        ids = [q.id for q in self.questions(b)]
        loaded = {spec.name: self.results.load(b, spec.name, ids) for spec in self.specs}
        collected.failures[(b, ROUND0)] = self.results.failures(b, ROUND0, ids)
        for spec in self.specs:
            collected.failures[(b, spec.name)] = self.results.failures(b, spec.name, ids)
        if self.results.round0_path(b).exists():
            round0 = self.results.round0(b)
            for spec in self.specs:
                check_round0(b, spec.name, loaded[spec.name], round0, self.results.round0_path(b))
        else:
            collected.legacy.append(b)
        # Compare methods on the same questions: those every method with traces has finished.
        present = [ts for ts in loaded.values() if ts]
        common = set.intersection(*({t.question_id for t in ts} for ts in present)) if present else set()
        if len(common) < len(ids):
            log.warning("%s: reporting the %d of %d questions finished by every method", b, len(common), len(ids))
        for spec in self.specs:
            traces = [t for t in loaded[spec.name] if t.question_id in common]
            if not traces:
                log.warning("no finished traces for %s/%s; left out of the report", b, spec.name)
                continue
            collected.model_ids.update(m for t in traces for m in t.model_ids)
            collected.results.append(report.evaluate(b, spec.name, self.label(spec), traces, seed=self.s.seed,
                                                     n_boot=self.s.n_boot))

    def report(self, command: str, backend_synthetic: bool | None = None) -> list[report.MethodResult]:
        """Summary, CSV and plots of `collect`'s results, written into the results directory.
        `backend_synthetic`: whether this run's backends are synthetic (None: none was built)."""
        collected = self.collect()
        results, model_ids = collected.results, collected.model_ids
        out = self.results.root
        run_json = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        synthetic = bool(backend_synthetic if backend_synthetic is not None else run_json.get("synthetic", False))
        synthetic = synthetic or any(registry.is_synthetic(m) for m in model_ids)
        report.write_csv(results, out / "summary.csv", failures=collected.failures)
        meta = self._meta(collected, command, synthetic, backend_synthetic, run_json)
        md = report.markdown(results, meta, seed=self.s.seed, n_boot=self.s.n_boot)
        regraded = report.read_regrade_record(out)
        if regraded is not None:
            md += "\n" + "\n".join(report.moved_note(regraded, {
                f"{r.benchmark}/{r.method}": (r.summary.accuracy.mean, r.summary.accuracy_seeded.mean)
                for r in results}, n_now={f"{r.benchmark}/{r.method}": r.summary.n for r in results}))
        (out / "summary.md").write_text(md, encoding="utf-8")
        plots.write_all(results, out, synthetic=synthetic)
        run_json["synthetic"] = synthetic
        write_json(out / "run.json", run_json, indent=1)
        return results

    def _meta(self, collected: Collected, command: str, synthetic: bool, backend_synthetic: bool | None,
              run_json: dict[str, Any]) -> dict[str, Any]:
        """The report's header: command, model, policy, seeds, questions, debate settings, labels and notes."""
        s, results = self.s, collected.results
        timings = self.results.timings()
        generation = {b: sum(v for k, v in timings.items() if k.split("/", 1)[0] == b) for b in s.benchmarks}
        requested = {b: len(self.questions(b)) for b in s.benchmarks}
        reported = {b: max((r.summary.n for r in results if r.benchmark == b), default=0) for b in s.benchmarks}
        return {
            "title": "DEAR evaluation" + (" (SYNTHETIC)" if synthetic else ""),
            "synthetic": synthetic,
            "command": command,
            "model": ", ".join(sorted(collected.model_ids)) + f" (`--llm {s.llm}`)",
            "checkpoint": self._checkpoint_note(backend_synthetic),
            "policy_sampling": self._policy_note(),
            "seed": f"{s.seed} (question subset, sampling seeds, tie-breaks, bootstrap)",
            "n": ", ".join(f"{b}: {reported[b]}" + (f" of {requested[b]} requested" if reported[b] != requested[b]
                                                    else "") for b in s.benchmarks),
            "debate": (f"V={s.n_agents} agents, R={s.n_rounds} exchange rounds, round-0/fixed sampling "
                       f"T={s.temperature}, top-p={s.top_p}, max_tokens={s.max_tokens}, "
                       f"self-consistency samples={s.sc_samples}, exchange layout {s.layout}, "
                       f"{s.n_boot} bootstrap resamples"
                       + (f", agent profiles {', '.join(s.agent_profiles)} (a wider round 0 continues the "
                          f"pool in order)" if s.agent_profiles else "")),
            "agent_profiles": s.agent_profiles,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_time": f"{sum(timings.values()) / 60:.1f} min of generation over all runs of this directory"
                         if timings else "",
            "failures": collected.failures,
            "labels": {ROUND0: "round 0 (shared)", **{spec.name: self.label(spec) for spec in self.specs}},
            "generation_s": generation if timings else {},
            "notes": [self._sharing_note(collected.legacy)] + [
                f"Random-mask control on {b}: each pair read with probability {', '.join(f'{p:.3f}' for p in d)} "
                f"in exchange rounds 1..{len(d)} (DEAR's realized read density there, drawn independently; the "
                f"realized densities are in the read-density table)"
                for b, d in run_json.get("random_mask_density", {}).items()
                if b in s.benchmarks and "dear-random-mask" in s.methods],
        }

    def _sharing_note(self, legacy: list[str]) -> str:
        if legacy:
            return (f"Round 0 of {', '.join(legacy)} was not stored (an older eval.run wrote these traces): "
                    "methods shared it only through the response cache, which is not verified here; answers of "
                    "completions cut at the token limit were extracted by the older rule (last-number fallback).")
        adaptive = ("adaptive self-consistency = the first V, then one more at a time until enough agree (at most "
                    "n; charged only the answers it read), " if any(s.rule for s in self.specs) else "")
        return ("Shared work: round 0 was generated once per question (traces/<benchmark>/round0.jsonl) and every "
                "method starts from it — single CoT = agent 0, round-0 majority = the first V answers, "
                f"self-consistency = the first n, {adaptive}the debates continue the first V; every method's round-0 "
                "text was checked against the stored one. Every method is still charged the tokens of all its calls, "
                "round 0 included.")

    def _policy_note(self) -> str:
        if self.ckpt is None:
            return ""
        if self.s.policy_sampling == "deterministic":
            return "deterministic — the mode of the policy (pairs with p > 0.5, behavior mean)"
        return "sampled — pairs and behavior drawn from the policy (torch seeded per chunk by --seed)"

    def _checkpoint_note(self, backend_synthetic: bool | None) -> str:
        if self.ckpt is None:
            return ""
        c = self.ckpt
        note = f"{c.path} (trained with {c.trained_on or 'unknown backend'}; encoder {self.s.encoder or c.encoder})"
        if c.policy_config.actions == "extended":
            note += " — extended action set: each agent's turn revise / keep / fresh sample, and a stop"
        if c.decision != "last-round":
            weighted = ", each weighted by its agent's certainty 1 − u in its round" \
                if c.decision == "belief-weighted" else ""
            note += (f"; its debates' final vote is `{c.decision}` (every sample the debate drew: round 0, fresh "
                     f"samples and revisions; a kept answer does not vote twice{weighted}), the rule it was trained "
                     "with")
        if c.synthetic and not (backend_synthetic or False):
            note += " — **sim-to-real transfer**: the policy was trained on the synthetic sim backend"
        return note
