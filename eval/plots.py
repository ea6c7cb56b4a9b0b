"""PNG plots of an evaluation (matplotlib, Agg): accuracy vs tokens with the accuracy-cost frontier, per-round
accuracy, transitions, HCR/BCR."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, NullFormatter

from dear.metrics import TRANSITIONS, wilson_ci
from eval.report import MethodResult, dominated_by

TRANSITION_COLORS = ("#4c9a2a", "#d62728", "#1f77b4", "#9e9e9e")  # C->C green, C->I red, I->C blue, I->I grey


def _grid(results: Sequence[MethodResult]) -> tuple[list[str], list[str], dict]:
    benchmarks = list(dict.fromkeys(r.benchmark for r in results))
    methods = list(dict.fromkeys(r.method for r in results))
    return benchmarks, methods, {(r.benchmark, r.method): r for r in results}


def _colors(methods: Sequence[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def _subplots(n: int, width: float = 5.2, height: float = 4.0):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, axes[0]


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def _markers(methods: Sequence[str]) -> dict[str, str]:
    return {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(methods)}


def _finish(fig, axes, text: str, synthetic: bool, path: Path) -> None:
    """Title (red SYNTHETIC tag for the sim backend), one legend right of the panels, tight save."""
    fig.suptitle(text + ("  [SYNTHETIC: sim backend]" if synthetic else ""), fontsize=11,
                 color="#b00000" if synthetic else "black")
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.tight_layout()
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _bar(ci, scale: float = 1.0) -> list[list[float]]:
    """matplotlib's [[below], [above]] error bar of an interval around its estimate. A bootstrap interval can
    miss its estimate by float rounding (or exclude it), so both sides are clipped at 0."""
    return [[max(0.0, scale * (ci.mean - ci.low))], [max(0.0, scale * (ci.high - ci.mean))]]


def frontier_line(results: Sequence[MethodResult], benchmark: str) -> tuple[list[float], list[float]]:
    """(tokens, accuracy %) of the benchmark's methods on the accuracy-cost frontier (`report.dominated_by`), by
    tokens, then the best accuracy carried to the costliest method's tokens: the staircase `accuracy_vs_tokens`
    draws (the best accuracy reached at each budget)."""
    dominated = dominated_by(results)
    mine = [r for r in results if r.benchmark == benchmark]
    points = sorted((r.summary.total_tokens.mean, 100 * r.summary.accuracy.mean) for r in mine
                    if not dominated[(benchmark, r.method)])
    right = max(r.summary.total_tokens.mean for r in mine)
    if points and right > points[-1][0]:
        points.append((right, points[-1][1]))
    return [x for x, _ in points], [y for _, y in points]


def accuracy_vs_tokens(results: Sequence[MethodResult], path: Path, synthetic: bool = False) -> None:
    """Accuracy against tokens per question, one panel per benchmark, with the accuracy-cost frontier drawn as a
    staircase through the methods no other method dominates (dominated methods: hollow markers)."""
    benchmarks, methods, by = _grid(results)
    colors, markers = _colors(methods), _markers(methods)
    dominated = dominated_by(results)
    fig, axes = _subplots(len(benchmarks))
    for ax, b in zip(axes, benchmarks):
        for m in methods:
            r = by.get((b, m))
            if r is None:
                continue
            s = r.summary
            ax.errorbar(
                s.total_tokens.mean, 100 * s.accuracy.mean,
                xerr=_bar(s.total_tokens), yerr=_bar(s.accuracy, 100.0),
                fmt=markers[m], color=colors[m], capsize=3, markersize=7, label=r.label, alpha=0.9,
                markerfacecolor="none" if dominated[(b, m)] else colors[m],
            )
        xs, ys = frontier_line(results, b)
        ax.plot(xs, ys, drawstyle="steps-post", color="black", linestyle="--", linewidth=1.0, zorder=0,
                label="accuracy–cost frontier; hollow = dominated" + (" [SYNTHETIC]" if synthetic else ""))
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(x=0.15)
        ax.set_xlabel("tokens per question (prompt + completion, log scale)")
        ax.set_ylabel("accuracy % (95 % bootstrap CI)")
        ax.set_title(f"{b} (n={max(by[(b, m)].summary.n for m in methods if (b, m) in by)})")
        ax.grid(True, alpha=0.3, which="both")
        ax.set_ylim(-2, 102)
    _finish(fig, axes, "Accuracy vs. tokens per question", synthetic, path)


def round_accuracy(results: Sequence[MethodResult], path: Path, synthetic: bool = False) -> None:
    benchmarks, methods, by = _grid(results)
    colors, markers = _colors(methods), _markers(methods)
    fig, axes = _subplots(len(benchmarks))
    n_rounds = max(r.summary.n_rounds for r in results)
    for ax, b in zip(axes, benchmarks):
        values = []
        for m in methods:
            r = by.get((b, m))
            if r is None:
                continue
            acc = 100 * np.asarray(r.summary.round_accuracy)
            values += [float(x) for x in acc if not math.isnan(x)]
            if len(acc) > 1:
                ax.plot(range(len(acc)), acc, marker=markers[m], color=colors[m], label=r.label, alpha=0.85)
            else:  # single-round methods: a reference line
                ax.axhline(acc[0], color=colors[m], linestyle="--", linewidth=1.2, label=f"{r.label} (no exchange)")
        ax.set_xticks(range(n_rounds))
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy % of the round's plurality")
        ax.set_title(b)
        if values:  # zoom on the data: round-to-round changes are small
            ax.set_ylim(max(0.0, min(values) - 10), min(100.0, max(values) + 10))
        ax.grid(True, alpha=0.3)
    _finish(fig, axes, "Per-round accuracy", synthetic, path)


def transitions(results: Sequence[MethodResult], path: Path, synthetic: bool = False) -> None:
    """Horizontal stacked bars: share of agent transitions C->C / C->I / I->C / I->I per method and round."""
    benchmarks, methods, by = _grid(results)
    debate_methods = [m for m in methods if any(by.get((b, m)) and by[(b, m)].summary.n_rounds > 1
                                                for b in benchmarks)]
    n_bars = max([sum(len(by[(b, m)].summary.transitions) for m in debate_methods if (b, m) in by)
                  for b in benchmarks] + [1])
    fig, axes = _subplots(len(benchmarks), width=5.5, height=1.2 + 0.32 * n_bars)
    for ax, b in zip(axes, benchmarks):
        labels, stacks = [], []
        for m in debate_methods:
            r = by.get((b, m))
            if r is None:
                continue
            for k, counts in enumerate(r.summary.transitions):
                total = counts.sum()
                labels.append(f"{r.label}  {k}→{k + 1}")
                stacks.append(100 * counts / total if total else np.zeros(4))
        if not stacks:
            ax.text(0.5, 0.5, "no multi-round methods", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        stacks_arr = np.array(stacks)
        y = np.arange(len(labels))[::-1]  # first method on top
        left = np.zeros(len(labels))
        for j, name in enumerate(TRANSITIONS):
            ax.barh(y, stacks_arr[:, j], left=left, color=TRANSITION_COLORS[j], label=name.replace("->", "→"),
                    height=0.75)
            for yi, v, l0 in zip(y, stacks_arr[:, j], left):
                if v >= 7:
                    ax.text(l0 + v / 2, yi, f"{v:.0f}", ha="center", va="center", fontsize=7, color="white")
            left += stacks_arr[:, j]
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_xlabel("% of agent transitions")
        ax.set_xlim(0, 100)
        ax.set_title(b)
    _finish(fig, axes, "Answer transitions per agent (round r → r+1)", synthetic, path)


def conformity(results: Sequence[MethodResult], path: Path, synthetic: bool = False) -> None:
    """HCR and BCR per method, each beside its narrow variant (agents that read a peer; the change is adopting
    the plurality), with Wilson 95 % intervals; bar labels give numerator/denominator."""
    benchmarks, methods, by = _grid(results)
    debate_methods = [m for m in methods if any(by.get((b, m)) and by[(b, m)].summary.n_rounds > 1
                                                for b in benchmarks)]
    fig, axes = _subplots(len(benchmarks), width=max(5.2, 1.6 * len(debate_methods) + 1.5), height=4.4)
    bars = (("hcr", "HCR (harmful conformity)", "#d62728", None),
            ("hcr_narrow", "HCR narrow (read a peer, adopted the wrong plurality)", "#d62728", "//"),
            ("bcr", "BCR (beneficial correction)", "#1f77b4", None),
            ("bcr_narrow", "BCR narrow (read a peer, adopted the right plurality)", "#1f77b4", "//"))
    width = 0.2
    for ax, b in zip(axes, benchmarks):
        res = [by[(b, m)] for m in debate_methods if (b, m) in by]
        if not res:
            ax.text(0.5, 0.5, "no multi-round methods", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        x = np.arange(len(res))
        for k, (name, label, color, hatch) in enumerate(bars):
            off = (k - 1.5) * width
            ratios = [getattr(r.summary, name) for r in res]
            cis = [wilson_ci(q) for q in ratios]
            vals = np.array([0.0 if math.isnan(c.mean) else 100 * c.mean for c in cis])
            err = np.array([[0.0, 0.0] if math.isnan(c.mean) else [b[0] for b in _bar(c, 100.0)]
                            for c in cis]).T
            ax.bar(x + off, vals, width, yerr=err, capsize=2, color=color, hatch=hatch, edgecolor="white",
                   alpha=0.6 if hatch else 1.0, error_kw={"elinewidth": 1}, label=label)
            for xi, (q, v, hi) in enumerate(zip(ratios, vals, err[1])):
                ax.text(xi + off, v + hi + 1.5 if q.den else 1.5, f"{q.num}/{q.den}" if q.den else "n/a",
                        ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_xticks(x, [r.label for r in res], fontsize=8, rotation=25, ha="right")
        ax.set_xlim(-0.8, len(res) - 0.2)  # bars keep their width when only one method has rounds
        ax.set_ylabel("rate % (Wilson 95 % CI)")
        ax.set_ylim(0, 118)
        ax.set_yticks(range(0, 101, 20))
        ax.set_title(b)
        ax.grid(True, axis="y", alpha=0.3)
    _finish(fig, axes, "Harmful conformity (HCR) and beneficial correction (BCR), both readings", synthetic, path)


PLOTS = {
    "accuracy_vs_tokens.png": accuracy_vs_tokens,
    "round_accuracy.png": round_accuracy,
    "transitions.png": transitions,
    "conformity.png": conformity,
}


def write_all(results: Sequence[MethodResult], out_dir: Path, synthetic: bool = False) -> list[Path]:
    paths = []
    for name, fn in PLOTS.items():
        p = out_dir / name
        fn(results, p, synthetic=synthetic)
        paths.append(p)
    return paths
