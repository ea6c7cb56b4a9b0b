"""One method on one chunk of questions, continuing their stored round 0 (`eval.run`'s inner step), and the
statistics of DEAR's own debates that its random-mask control matches."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from dear.atomic import write_json
from dear.debate import DebateConfig, DebateEngine
from dear.debate.engine import Debate
from dear.debate.interventions import InterventionProtocol
from dear.debate.sampling_rules import DEFAULT_PARAMS, FittedParams
from dear.debate.trace import DebateTrace
from dear.integrity import read_json
from dear.regulator import CertaintyWeigher
from dear.seeds import derive_seed
from dear.tasks.types import Question
from eval import methods as M
from eval import report
from eval.action_frequencies import ActionFrequencies, action_frequencies
from eval.results_dir import EvalSettings, ResultsDir, check_round0

log = logging.getLogger("eval")


class DearActions:
    """DEAR's realized actions per benchmark, which its random control matches: the per-round read density, and an
    extended policy's per-round stop, kind and reviser read frequencies (eval/action_frequencies.py). Read from all
    of DEAR's finished debates when the control first needs them in this run, kept for the run and recorded in
    run.json."""

    def __init__(self, results: ResultsDir, n_rounds: int):
        self.results, self.n_rounds = results, n_rounds
        self._density: dict[str, list[float]] = {}  # benchmark -> the random mask's per-round pair probability
        self._frequencies: dict[str, ActionFrequencies] = {}  # benchmark -> an extended policy's random control

    def density(self, benchmark: str) -> list[float]:
        """DEAR's realized per-round read density on this benchmark."""
        if benchmark in self._density:
            return self._density[benchmark]
        from dear.metrics import summarize

        traces = self._dear_traces(benchmark, "per-round read density")
        density = summarize([report.trace_to_record(t) for t in traces], n_boot=1).read_density
        if len(density) < self.n_rounds or any(x != x for x in density[:self.n_rounds]):  # NaN: round not reached
            raise ValueError(f"DEAR's traces on {benchmark} do not cover {self.n_rounds} exchange rounds "
                             f"(read density {density})")
        self._density[benchmark] = density[:self.n_rounds]
        self._record("random_mask_density", benchmark, self._density[benchmark])
        return self._density[benchmark]

    def frequencies(self, benchmark: str) -> ActionFrequencies:
        """DEAR's realized per-round stop, kind and reviser read frequencies on this benchmark."""
        if benchmark not in self._frequencies:
            traces = self._dear_traces(benchmark, "action frequencies")
            self._frequencies[benchmark] = action_frequencies(traces, self.n_rounds)
            self._record("random_policy_frequencies", benchmark, self._frequencies[benchmark].to_json())
        return self._frequencies[benchmark]

    def _dear_traces(self, benchmark: str, what: str) -> list[DebateTrace]:
        traces = self.results.load(benchmark, "dear", sorted(self.results.finished(benchmark, "dear")))
        if not traces:
            raise ValueError(f"dear-random-mask matches DEAR's {what} on {benchmark}, but DEAR has no finished "
                             f"debates there: add dear to --methods or run it first")
        return traces

    def _record(self, key: str, benchmark: str, value: Any) -> None:
        path = self.results.root / "run.json"
        run_json = read_json(path, "run settings") if path.exists() else {}
        run_json.setdefault(key, {})[benchmark] = value
        write_json(path, run_json, indent=1)


class ChunkRunner:
    """Runs one method on a chunk of questions from their stored round 0: builds the method (`eval.methods.build`),
    continues the stored answers under its protocol (an adaptive rule: cuts them to the answers it reads), checks
    that round 0 stayed the stored one, and returns the traces with a DEAR method's regulator records.
    `backend` and `encoder` are called only when needed (a finished run loads no model)."""

    def __init__(self, settings: EvalSettings, base: DebateConfig, ckpt: M.Checkpoint | None, results: ResultsDir,
                 backend: Callable[[], Any], encoder: Callable[[], Any]):
        self.s, self.base, self.ckpt, self.results = settings, base, ckpt, results
        self.backend, self.encoder = backend, encoder
        self.dear = DearActions(results, settings.n_rounds)
        self.fitted = FittedParams.load(settings.rule_params) if settings.rule_params else None

    def run(self, spec: M.MethodSpec, benchmark: str, chunk: list[Question], chunk_index: int,
            round0: dict[str, DebateTrace]) -> tuple[list[DebateTrace], dict | None]:
        run, frequencies, density = self._build(spec, benchmark, chunk_index)
        engine = DebateEngine(self.backend(), run.config, weigher=self._weigher(run.config))
        if spec.rule:  # adaptive self-consistency: each question reads its own prefix; nothing is generated
            debates = self._rule_debates(spec, run, chunk, round0)
        else:
            width = run.config.n_agents
            debates = engine.start_from_round0(chunk, [round0[q.id].rounds[0][:width] for q in chunk],
                                               n_rounds=run.protocol.n_rounds, protocol=spec.name)
        if isinstance(run.protocol, InterventionProtocol):  # judge / policy / regenerate / moderator
            run.protocol.drive(engine, debates)
        else:
            while active := [d for d in debates if not d.done]:
                engine.step(active, run.protocol.controls(active))
        n_failed = sum(d.failed for d in debates)
        if n_failed:
            log.warning("%s/%s: %d of %d debates failed; the next run retries them", benchmark, spec.name,
                        n_failed, len(debates))
        traces = [d.trace for d in debates]
        for t in traces:
            t.protocol = spec.name
        check_round0(benchmark, spec.name, traces, round0, self.results.round0_path(benchmark))
        regulator = getattr(run.protocol, "records", None) if spec.needs_checkpoint else None
        if frequencies is not None:
            log.info("%s/%s: random policy with DEAR's per-round action frequencies %s", benchmark, spec.name,
                     frequencies.to_json())
        elif density is not None:
            log.info("%s/%s: random mask with DEAR's per-round read density %s", benchmark, spec.name,
                     np.round(density, 3).tolist())
        return traces, regulator

    def _build(self, spec: M.MethodSpec, benchmark: str, chunk_index: int
               ) -> tuple[M.MethodRun, ActionFrequencies | None, list[float] | None]:
        """The method's run on this chunk, with the DEAR statistics a random control matches."""
        random_control = spec.kind == "dear" and spec.selection_mode == "random"
        # an extended policy may stop before a round: its control matches frequencies, not one density over turns
        frequencies = self.dear.frequencies(benchmark) if random_control and self.ckpt.extended else None
        density = frequencies.density if frequencies else self.dear.density(benchmark) if random_control else None
        run = M.build(spec, self.base, self.s.sc_samples, self.ckpt,
                      self.encoder() if spec.needs_checkpoint else None,
                      seed=derive_seed(self.s.seed, chunk_index, 0xD0),  # random-mask draws: fixed per chunk
                      deterministic=self.s.policy_sampling == "deterministic", density=density,
                      frequencies=frequencies, fitted=self.fitted)
        if spec.needs_checkpoint and self.s.policy_sampling == "sampled":
            import torch

            torch.manual_seed(derive_seed(self.s.seed, chunk_index, 0xA5))  # sampled actions: fixed per chunk
        return run, frequencies, density

    def _weigher(self, config: DebateConfig) -> CertaintyWeigher | None:
        """The belief-weighted vote's weights from the checkpoint's own evidence (None for the other rules)."""
        if config.decision != "belief-weighted":
            return None
        return CertaintyWeigher(self.encoder(), self.ckpt.answer_aware if self.ckpt else 0.0)

    def _rule_debates(self, spec: M.MethodSpec, run: M.MethodRun, chunk: list[Question],
                      round0: dict[str, DebateTrace]) -> list[Debate]:
        """The finished debates of an adaptive rule: each question's stored round 0 cut to the answers the rule
        reads (`M.rule_width`), voted by the engine like every method (one engine per width)."""
        params = self.fitted.of(spec.rule) if self.fitted is not None else DEFAULT_PARAMS
        widths = {q.id: M.rule_width(spec, round0[q.id].rounds[0], self.s.n_agents, self.s.sc_samples, params)
                  for q in chunk}
        debates: dict[str, Debate] = {}
        for width in sorted(set(widths.values())):
            group = [q for q in chunk if widths[q.id] == width]
            engine = DebateEngine(self.backend(), replace(run.config, n_agents=width))
            for d in engine.start_from_round0(group, [round0[q.id].rounds[0][:width] for q in group],
                                              n_rounds=0, protocol=spec.name):
                debates[d.question.id] = d
        return [debates[q.id] for q in chunk]
