"""Make the simulator's observations (e_ij) look like real ones, and measure it.

    python -m simworld.evidence_match --corpus results/corpus-gsm8k --out results/corpus-gsm8k/evidence \\
        [--encoder minilm] [--params results/corpus-gsm8k/fit/sim_params_synthetic_fit.json]

The choice: the sim emits real texts, recombined. A text bank is built from the training questions of the corpus (the same
seeded question split as simworld.fit): for each real question, its distinct parsed answers with the real
completions that gave them. With `SimBackend(text_bank=...)` the sim keeps its decisions and token counts but
writes a real completion of the matching answer class (dear/sim/, "Real texts"), whose sentences are
dropped (probability 1 − keep) or swapped for a sentence of the question's other texts (probability mix): a
corpus with a few texts per answer class would otherwise show two agreeing agents the identical text. keep and
mix are fitted by grid search on the training questions' pairs (KS agree + KS differ; in a mixed pool per pair
type, `recombination_score`) and validated on the held-out ones; the fitted world is written to `sim_params_synthetic_texts.json`. Why not model e_ij
directly: e_ij is computed by the evaluation's encoder from texts (reasoning and conclusion separately), so
real texts give the right e_ij under any encoder (MiniLM, BGE-M3, hashing) and keep the joint structure of the
V×V matrix and of h, c, with no per-encoder distribution to fit; modelling e_ij would tie the simulator to one
encoder and need a hook past the encoder in the regulator.

Reported, for pairs of agents whose parsed answers agree / differ (all rounds pooled), under `--encoder`:
real (held-out corpus questions and MAD debates: texts the bank never saw) vs the sim with its own pseudo-word
texts, whole bank texts and recombined bank texts, MAD debates on synthetic questions: mean, sd, quantiles, the
separation d′ and the two-sample Kolmogorov–Smirnov distance real vs sim (scipy.stats.ks_2samp).
Outputs: `text_bank.json.gz`, `sim_params_synthetic_texts.json`, `evidence_report.md`, `evidence_report.json`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import ks_2samp

from dear.atomic import write_json
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.engine import DebateEngine
from dear.debate.protocols import MADProtocol
from dear.evidence import Encoder, make_encoder, pairwise_evidence
from dear.llm.registry import is_synthetic
from dear.sim.backend import ANSWER_ONLY_STYLES, SimBackend
from dear.sim.params import SimParams
from dear.tasks.synthetic import load_synthetic
from simworld.fit import Corpus, load_corpus, split_by_question
from simworld.validation import sim_debate_config

log = logging.getLogger("simworld.evidence_match")
PROG = "python -m simworld.evidence_match"
BANK_FILE = "text_bank.json.gz"
PARAMS_FILE = "sim_params_synthetic_texts.json"  # the --params world plus the fitted recombination
KEEP_GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
MIX_GRID = (0.0, 0.1, 0.2, 0.3, 0.4)


def build_text_bank(traces: Sequence[dict]) -> dict[str, Any]:
    """Per question: answer classes (correct first, then by frequency) with the completions that gave them.
    Turns cut at max_tokens, failed, without a parsed answer or of an answer-only agent (the sim writes their
    answer line itself) are left out."""
    by_q: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for tr in traces:
        for turns in tr["rounds"]:
            for t in turns:
                if t.get("answer_key") is None or t.get("error") or t.get("finish_reason") == "length" \
                        or t.get("silent") or not (t.get("text") or "").strip() \
                        or t.get("style") in ANSWER_ONLY_STYLES:
                    continue
                c = by_q[tr["question_id"]].setdefault(t["answer_key"], {"answer": t["answer_key"],
                                                                          "correct": bool(t["correct"]), "texts": []})
                if t["text"] not in c["texts"]:
                    c["texts"].append(t["text"])
    questions = []
    for qid in sorted(by_q):
        classes = sorted(by_q[qid].values(), key=lambda c: (not c["correct"], -len(c["texts"]), c["answer"]))
        questions.append({"id": qid, "classes": classes})
    # A text states its class's real answer; the sim rewrites it to its own (dear.sim.bank.rewrite_answer), so an
    # agent that agrees with another says the same number, as real ones do (answer-only agents show nothing else).
    return {"questions": questions, "n_texts": sum(len(c["texts"]) for q in questions for c in q["classes"]),
            "rewrite_answers": True}


def write_text_bank(bank: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(bank, ensure_ascii=False).encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0))  # no timestamp: the same bank gives the same bytes
    return path


def pair_type(a: dict, b: dict) -> str:
    """The reply styles of a pair of turns, sorted: `cot-direct` (a turn without a style is the paper's `cot`)."""
    return "-".join(sorted((a.get("style") or "cot", b.get("style") or "cot")))


def pair_evidence(traces: Sequence[dict], encoder: Encoder) -> dict[str, np.ndarray]:
    """e_ij of every agent pair with two parsed answers, split by whether the answers agree (rounds pooled): keys
    `agree` and `differ`; in a mixed pool (pairs of more than one `pair_type`) also `agree cot-direct`, ... per
    type, whose e_ij differ far more between types than between agreeing and differing pairs."""
    rounds = [turns for tr in traces for turns in tr["rounds"] if len(turns) >= 2]
    if not rounds:
        return {"agree": np.zeros(0), "differ": np.zeros(0)}
    texts = [t["reasoning"] or "(no answer)" for turns in rounds for t in turns] + \
            [t["conclusion"] or "(no answer)" for turns in rounds for t in turns]
    emb = encoder.encode(texts)
    n = len(texts) // 2
    h_all, c_all = emb[:n], emb[n:]
    out: dict[str, list[float]] = {"agree": [], "differ": []}
    typed: dict[str, list[float]] = {}
    pos = 0
    for turns in rounds:
        v = len(turns)
        e = pairwise_evidence(h_all[pos:pos + v][None], c_all[pos:pos + v][None])[0]
        pos += v
        keys = [t.get("answer_key") for t in turns]
        for i in range(v):
            for j in range(i + 1, v):
                if keys[i] is not None and keys[j] is not None:
                    kind = "agree" if keys[i] == keys[j] else "differ"
                    out[kind].append(float(e[i, j]))
                    typed.setdefault(f"{kind} {pair_type(turns[i], turns[j])}", []).append(float(e[i, j]))
    if len({k.split(" ", 1)[1] for k in typed}) > 1:
        out.update(sorted(typed.items()))
    return {k: np.array(v) for k, v in out.items()}


def typed_keys(real: dict[str, np.ndarray], sim: dict[str, np.ndarray]) -> list[str]:
    """The per-pair-type keys both sides hold pairs of (none for a pool of one style)."""
    return [k for k in real if " " in k and len(real[k]) and len(sim.get(k, ()))]


def recombination_score(real: dict[str, np.ndarray], sim: dict[str, np.ndarray]) -> float:
    """What the recombination grid minimises: KS(agree) + KS(differ), or in a mixed pool the sum of the per-type
    distances, so that a sim whose pairs mix the types in other proportions is not preferred for that."""
    keys = typed_keys(real, sim) or ["agree", "differ"]
    return float(sum(ks(real[k], sim[k])["statistic"] for k in keys))


def simulate_traces(params: SimParams, settings: dict[str, Any], n: int, seed: int,
                    text_bank: str | Path | None) -> list[dict]:
    """MAD debates of the sim on synthetic questions (the regime of the issue's table), as trace dicts."""
    cfg = sim_debate_config(settings, seed)
    engine = DebateEngine(SimBackend(params, seed=seed, text_bank=text_bank), cfg)
    debates = engine.run(load_synthetic(n, seed=seed, split="test"), MADProtocol(cfg.n_agents, cfg.n_rounds))
    return [d.trace.to_dict() for d in debates if not d.failed]


def describe(x: np.ndarray) -> dict[str, Any]:
    if not len(x):
        return {"n": 0}
    return {"n": int(len(x)), "mean": float(x.mean()), "sd": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "quantiles": [float(q) for q in np.quantile(x, [0.05, 0.25, 0.5, 0.75, 0.95])]}


def d_prime(a: np.ndarray, d: np.ndarray) -> float:
    if len(a) < 2 or len(d) < 2:
        return float("nan")
    pooled = math.sqrt((a.var(ddof=1) + d.var(ddof=1)) / 2)
    return float((a.mean() - d.mean()) / pooled) if pooled > 0 else float("inf")


def ks(real: np.ndarray, sim: np.ndarray) -> dict[str, float]:
    if not len(real) or not len(sim):
        return {"statistic": float("nan"), "pvalue": float("nan")}
    r = ks_2samp(real, sim)
    return {"statistic": float(r.statistic), "pvalue": float(r.pvalue)}


def compare(real: dict[str, np.ndarray], sims: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    out: dict[str, Any] = {"real": {k: describe(v) for k, v in real.items()}}
    out["real"]["d_prime"] = d_prime(real["agree"], real["differ"])
    for name, s in sims.items():
        out[name] = {k: describe(v) for k, v in s.items()}
        out[name]["d_prime"] = d_prime(s["agree"], s["differ"])
        out[name]["ks_vs_real"] = {k: ks(real[k], s[k]) for k in ("agree", "differ", *typed_keys(real, s))}
    return out


def report_markdown(res: dict[str, Any], command: str, encoder: str, synthetic_corpus: bool) -> str:
    tag = " (SYNTHETIC corpus: sim backend)" if synthetic_corpus else ""
    lines = [f"# Evidence e_ij: real vs simulated{tag}", "", f"Command: `{command}`  ", f"Encoder: `{encoder}`. "
             "Pairs of agents with two parsed answers, all rounds pooled. Real: held-out corpus questions + MAD "
             "debates (texts the bank never saw). Sim: MAD on synthetic questions (synthetic numbers).", "",
             "| source | agreeing: n, mean (sd) | differing: n, mean (sd) | d′ | KS agree (p) | KS differ (p) |",
             "|---|---|---|---:|---|---|"]
    def cell(z: dict[str, Any]) -> str:
        return f"{z['n']}, {z['mean']:.3f} ({z['sd']:.3f})" if z["n"] else "0, –"

    for name, r in res.items():
        ksr = r.get("ks_vs_real")
        ks_cells = ([f"{ksr[k]['statistic']:.3f} ({ksr[k]['pvalue']:.2g})" for k in ("agree", "differ")]
                    if ksr else ["–", "–"])
        lines.append(f"| {name} | {cell(r['agree'])} | {cell(r['differ'])} | {r['d_prime']:.2f} | {ks_cells[0]} | "
                     f"{ks_cells[1]} |")
    lines += ["", "Quantiles (5, 25, 50, 75, 95 %), side by side:", "", "| source | agreeing | differing |",
              "|---|---|---|"]
    for name, r in res.items():
        q = {k: ", ".join(f"{x:.3f}" for x in r[k].get("quantiles", [])) for k in ("agree", "differ")}
        lines.append(f"| {name} | {q['agree']} | {q['differ']} |")
    typed = [k for k in res["real"] if " " in k]
    if typed:
        lines += ["", "By pair type (the reply styles of the two agents): a mixed pool's types differ far more than its "
                  "agreeing and differing pairs do, and real and simulated debates mix them in other proportions, so "
                  "each type is compared on its own (the grid below minimises the sum of these KS distances):", "",
                  "| source | " + " | ".join(f"{k}: n, mean (KS)" for k in typed) + " |",
                  "|---|" + "---|" * len(typed)]
        for name, r in res.items():
            ksr = r.get("ks_vs_real", {})
            cells = [(f"{r[k]['n']}, {r[k]['mean']:.3f}" if r.get(k, {}).get("n") else "0, –")
                     + (f" ({ksr[k]['statistic']:.3f})" if k in ksr else "") for k in typed]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def corpus_from_traces(paths: Sequence[str | Path]) -> Corpus:
    """Plain DebateTrace JSONL files (e.g. eval.run's traces) as a corpus whose debates are all split by question."""
    traces = []
    for path in paths:
        for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    t = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
                if not isinstance(t, dict) or "rounds" not in t:
                    raise ValueError(f"{path}:{lineno}: not a DebateTrace (no 'rounds')")
                if not t.get("failed") and len(t["rounds"]) >= 1:
                    traces.append(t)
    if not traces:
        raise ValueError(f"no usable debate traces in {[str(p) for p in paths]}")
    first = traces[0]
    settings = {"llm": (first.get("model_ids") or [""])[0], "n_agents": len(first["rounds"][0]),
                "n_rounds": max(len(t["rounds"]) for t in traces) - 1,
                "max_tokens": max((x.get("max_tokens") or 0) for t in traces for r in t["rounds"] for x in r) or 384}
    return Corpus(settings, traces, [])


@dataclass
class RecombinationFit:
    """The grid search of the bank's sentence recombination: KS distances to the training pairs per point."""
    keep: float
    mix: float
    grid: list[dict[str, float]]  # {"keep", "mix", "ks_agree", "ks_differ", "score"} per grid point


def fit_recombination(params: SimParams, settings: dict[str, Any], n_sim: int, seed: int, bank_path: Path,
                      encoder: Encoder, real_train: dict[str, np.ndarray], keeps: Sequence[float],
                      mixes: Sequence[float]) -> RecombinationFit:
    """(bank_sentence_keep, bank_sentence_mix) minimising `recombination_score` against the training questions'
    pairs. The same sim seed at every point, so the decisions are equal and only the texts differ."""
    grid = []
    for keep in keeps:
        for mix in mixes:
            p = replace(params, bank_sentence_keep=float(keep), bank_sentence_mix=float(mix))
            sim = pair_evidence(simulate_traces(p, settings, n_sim, seed, bank_path), encoder)
            ks_a, ks_d = (ks(real_train[k], sim[k])["statistic"] for k in ("agree", "differ"))
            grid.append({"keep": float(keep), "mix": float(mix), "ks_agree": ks_a, "ks_differ": ks_d,
                         "score": recombination_score(real_train, sim)})
            log.info("keep %.2f mix %.2f: KS agree %.3f differ %.3f", keep, mix, ks_a, ks_d)
    best = min(grid, key=lambda g: (g["score"], -g["keep"], g["mix"]))  # ties: the least recombination
    fit = RecombinationFit(best["keep"], best["mix"], grid)
    for edge in on_grid_edge(fit):
        log.warning("the fitted %s is on the edge of its grid: widen the grid", edge)
    return fit


def grid_markdown(fit: RecombinationFit) -> list[str]:
    lines = ["", "Sentence recombination fitted on the training questions' pairs (score = KS agree + KS differ, in a "
             "mixed pool the sum of the per-type distances; lower is better; the held-out rows above are the "
             "validation):", "",
             "| keep | mix | KS agree | KS differ | score |", "|---:|---:|---:|---:|---:|"]
    for g in fit.grid:
        mark = " ← chosen" if (g["keep"], g["mix"]) == (fit.keep, fit.mix) else ""
        lines.append(f"| {g['keep']:.2f} | {g['mix']:.2f} | {g['ks_agree']:.3f} | {g['ks_differ']:.3f} | "
                     f"{g['score']:.3f}{mark} |")
    edge = on_grid_edge(fit)
    if edge:
        lines += ["", f"**The chosen point is on the grid's edge ({', '.join(edge)}): widen the grid.**"]
    return lines


def on_grid_edge(fit: RecombinationFit) -> list[str]:
    """The parameters whose chosen value is the largest or smallest tried but not the end of [0, 1]."""
    edge = []
    for name in ("keep", "mix"):
        tried = sorted({g[name] for g in fit.grid})
        value = getattr(fit, name)
        if len(tried) > 1 and ((value == tried[0] and value > 0.0) or (value == tried[-1] and value < 1.0)):
            edge.append(f"{name} = {value:.2f}")
    return edge


def run(corpus_dir: str | Path | Corpus, out: str | Path, encoder_spec: str, params: SimParams, n_sim: int,
        holdout: float, seed: int, command: str, keeps: Sequence[float] = KEEP_GRID,
        mixes: Sequence[float] = MIX_GRID, params_source: str | None = None) -> dict[str, Any]:
    corpus = corpus_dir if isinstance(corpus_dir, Corpus) else load_corpus(corpus_dir)
    train, test = split_by_question(corpus.logging, holdout, seed)
    out = Path(out)
    bank = build_text_bank(train)
    if not bank["questions"]:
        raise ValueError(f"{corpus_dir}: no usable texts for a bank in the training questions")
    bank_path = write_text_bank(bank, out / BANK_FILE)
    encoder = make_encoder(encoder_spec)
    real = pair_evidence(test + corpus.mad, encoder)
    fit = fit_recombination(params, corpus.settings, n_sim, seed, bank_path, encoder, pair_evidence(train, encoder),
                            keeps, mixes)
    whole = replace(params, bank_sentence_keep=1.0, bank_sentence_mix=0.0)
    fitted = replace(params, bank_sentence_keep=fit.keep, bank_sentence_mix=fit.mix)
    fitted.to_json(out / PARAMS_FILE, source=params_source, command=command, encoder=encoder_spec,
                   text_bank=str(bank_path))
    sims = {"sim, own texts": simulate_traces(params, corpus.settings, n_sim, seed, None),
            "sim, whole bank texts": simulate_traces(whole, corpus.settings, n_sim, seed, bank_path),
            f"sim, recombined bank texts (keep {fit.keep:.2f}, mix {fit.mix:.2f})":
                simulate_traces(fitted, corpus.settings, n_sim, seed, bank_path)}
    res = compare(real, {name: pair_evidence(trs, encoder) for name, trs in sims.items()})
    synthetic = is_synthetic(corpus.settings.get("llm", ""))  # a spec, or a model id (--traces)
    sizes = (f"Real pairs from {len(test) + len(corpus.mad)} debates on {len({t['question_id'] for t in test})} held-out "
             f"+ {len({t['question_id'] for t in corpus.mad})} MAD questions; bank: {bank['n_texts']} texts of "
             f"{len(bank['questions'])} training questions; sim: {n_sim} MAD debates, seed {seed}. "
             f"The fitted world's parameters: `{out / PARAMS_FILE}`.")
    md = report_markdown(res, command, encoder_spec, synthetic) + "\n".join(grid_markdown(fit)) + "\n\n" + sizes
    (out / "evidence_report.md").write_text(md + "\n")
    write_json(out / "evidence_report.json", {"command": command, "encoder": encoder_spec, "bank": str(bank_path),
                                              "n_bank_texts": bank["n_texts"], "params": str(out / PARAMS_FILE),
                                              "recombination": asdict(fit), "results": res},
               indent=2, trailing_newline=True)
    return res


def _grid(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"{flag} must list probabilities in [0, 1], got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", help="corpus directory (python -m simworld.corpus)")
    src.add_argument("--traces", nargs="+", help="or DebateTrace JSONL files (all split by question)")
    ap.add_argument("--out", required=True, help="results directory (evidence_report.md/json, the text bank, the fitted SimParams)")
    ap.add_argument("--encoder", default="minilm", help="the encoder used at evaluation (default minilm)")
    ap.add_argument("--params", help="SimParams JSON (e.g. the fit); default: SimParams() defaults")
    ap.add_argument("--sim-debates", type=int, default=48)
    ap.add_argument("--holdout", type=float, default=0.2, help="as in simworld.fit (bank from the rest)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-grid", default=",".join(map(str, KEEP_GRID)), help="bank_sentence_keep values tried")
    ap.add_argument("--mix-grid", default=",".join(map(str, MIX_GRID)), help="bank_sentence_mix values tried")
    a = ap.parse_args(argv)
    if a.sim_debates < 1:
        ap.error("--sim-debates must be >= 1")
    if not 0.0 < a.holdout < 1.0:
        ap.error("--holdout must be in (0, 1)")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command = command_line(PROG, argv)
    params = SimParams.from_json(a.params) if a.params else SimParams()
    source = a.corpus if a.corpus else corpus_from_traces(a.traces)
    run(source, a.out, a.encoder, params, a.sim_debates, a.holdout, a.seed, command,
        _grid(a.keep_grid, "--keep-grid"), _grid(a.mix_grid, "--mix-grid"), a.params)
    print((Path(a.out) / "evidence_report.md").read_text())
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
