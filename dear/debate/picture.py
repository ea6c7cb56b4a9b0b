"""A debate drawn as one self-contained HTML page: inline CSS and inline SVG, no script, nothing fetched.

Rounds are columns and agents rows. Each turn is a box with its parsed answer (green when correct, red when
wrong, grey when the gold answer is unknown), its temperature and top-p (only where a model call was made: a kept
turn says "no call") and its tokens; hovering shows the whole turn (`<title>`). An arrow from agent j's box in round r-1 to agent i's box in round r means agent i read
agent j's answer in round r (the trace's per-turn `peers`, the round's mask); it is coloured by whether the
answer it carried was correct. A thin line joins an agent's own consecutive turns; a dashed box is a kept turn
(no model call), a double box a fresh sample from the question alone. The last column is the final vote.
Written by `python -m dear.show` (a stored trace) and `python -m dear.infer --html` (the debates just run).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dear.atomic import atomic_write_text
from dear.debate.trace import AgentTurn, DebateTrace

KIND_LABELS = {"sample": "sample", "revise": "revise", "keep": "kept, no call", "fresh": "fresh sample",
               "waiting": "waiting, not answered yet"}
MARK = {"correct": "\u2713", "wrong": "\u2717", "ungraded": ""}

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1f2328; background: #fff; }
h1 { font-size: 18px; margin: 0 0 6px; }
.question { white-space: pre-wrap; max-width: 1100px; margin: 0 0 8px; }
.facts, .legend { color: #57606a; margin: 4px 0; max-width: 1100px; }
.debate { margin-bottom: 40px; }
svg text { font: 13px system-ui, sans-serif; fill: #1f2328; }
svg .heading { font-weight: 600; fill: #57606a; }
svg .small { font-size: 11px; fill: #57606a; }
svg .answer { font-size: 16px; font-weight: 700; }
.turn rect, .vote rect { fill: #f6f8fa; stroke: #8c959f; stroke-width: 1.5; }
.turn.correct rect, .vote.correct rect { fill: #dafbe1; stroke: #1a7f37; }
.turn.wrong rect, .vote.wrong rect { fill: #ffebe9; stroke: #cf222e; }
.turn.keep rect { stroke-dasharray: 6 4; fill-opacity: 0.55; }
.turn rect.inner { fill: none; }
.correct .answer { fill: #1a7f37; } .wrong .answer { fill: #cf222e; }
.read { fill: none; stroke-width: 2; stroke-opacity: 0.8; }
.read.correct { stroke: #1a7f37; } .read.wrong { stroke: #cf222e; } .read.ungraded { stroke: #6e7781; }
.own { stroke: #afb8c1; stroke-width: 1.5; } .own.keep { stroke-dasharray: 4 4; }
.tokbar { fill: #54aeff; }
.tie { fill: #9a6700; font-weight: 700; }
"""


@dataclass(frozen=True)
class Geometry:
    """Pixel sizes of the drawing: a label column, one column per round, a vote column."""

    label_w: int = 190
    col_w: int = 210
    row_h: int = 104
    node_w: int = 156
    node_h: int = 84
    top: int = 30  # the round headings above the first row
    vote_w: int = 200

    def x(self, rnd: int) -> int:
        return self.label_w + rnd * self.col_w

    def y(self, agent: int) -> int:
        return self.top + agent * self.row_h

    def width(self, n_rounds: int) -> int:
        return self.label_w + n_rounds * self.col_w + self.vote_w

    def height(self, n_agents: int) -> int:
        return self.top + max(1, n_agents) * self.row_h


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def shorten(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with an ellipsis (the full text stays in the hover title)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def gold_known(trace: DebateTrace) -> bool:
    """Inference debates (dear.infer without answers) carry an empty gold and are not graded."""
    return bool(trace.gold)


def verdict(correct: bool, graded: bool) -> str:
    if not graded:
        return "ungraded"
    return "correct" if correct else "wrong"


def turn_kind(turn: AgentTurn) -> str:
    """waiting (not answered yet, no call), sample (round 0), keep (no model call), fresh (a new sample from the
    question alone) or revise."""
    if turn.waiting:
        return "waiting"
    if turn.round == 0:
        return "sample"
    if turn.silent:
        return "keep"
    return "fresh" if turn.fresh else "revise"


def answer_text(answer: str | None) -> str:
    return "no answer" if answer is None else answer


def turn_tokens(turn: AgentTurn) -> int:
    return turn.prompt_tokens + turn.completion_tokens


def agent_tokens(trace: DebateTrace, agent: int) -> tuple[int, int]:
    """(prompt, completion) tokens of one agent's turns over the kept rounds."""
    turns = [turns[agent] for turns in trace.rounds if agent < len(turns)]
    return sum(t.prompt_tokens for t in turns), sum(t.completion_tokens for t in turns)


def turn_title(trace: DebateTrace, turn: AgentTurn) -> str:
    """The hover text of one turn: everything the box has no room for."""
    graded = gold_known(trace)
    mark = f" ({verdict(turn.correct, graded)}; gold {trace.gold})" if graded else ""
    lines = [f"round {turn.round}, agent {turn.agent}: {KIND_LABELS[turn_kind(turn)]}",
             f"answer: {answer_text(turn.answer)}{mark}",
             f"read: {', '.join(f'agent {j}' for j in turn.peers) or 'nobody'}",
             sampling_title(turn),
             f"tokens: {turn.prompt_tokens:,} prompt + {turn.completion_tokens:,} completion"
             + (f" ({turn.reused_prompt_tokens:,} prompt tokens reused)" if turn.reused_prompt_tokens else ""),
             f"finish: {turn.finish_reason}"]
    if turn.error:
        lines.append(f"error: {turn.error}")
    if turn.guidance:
        lines.append(f"guidance: {shorten(turn.guidance, 300)}")
    lines.append(f"conclusion: {shorten(turn.conclusion, 400)}")
    return "\n".join(lines)


def sampling_label(turn: AgentTurn) -> str:
    """The box's sampling line: T and top-p of the call, or "no call" for a kept turn (the values the policy set
    for it were never used, so they are not shown)."""
    if turn.silent:
        return "no call"
    return f"T {turn.temperature:.2f} \u00b7 top-p {turn.top_p:.2f}"


def sampling_title(turn: AgentTurn) -> str:
    if turn.silent:
        return "no model call: the previous answer is kept (no sampling was used)"
    return f"T {turn.temperature:.3f}, top-p {turn.top_p:.3f}, seed {turn.seed}"


def svg_text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.0f}" y="{y:.0f}"{klass} text-anchor="{anchor}">{esc(text)}</text>'


def render_turn(trace: DebateTrace, turn: AgentTurn, g: Geometry) -> str:
    """One turn's box: answer and mark, T / top-p, kind and tokens, the whole turn on hover."""
    x, y = g.x(turn.round), g.y(turn.agent)
    kind, state = turn_kind(turn), verdict(turn.correct, gold_known(trace))
    parts = [f'<g class="turn {kind} {state}" data-round="{turn.round}" data-agent="{turn.agent}">',
             f"<title>{esc(turn_title(trace, turn))}</title>",
             f'<rect x="{x}" y="{y}" width="{g.node_w}" height="{g.node_h}" rx="8"/>']
    if kind == "fresh":
        parts.append(f'<rect class="inner" x="{x + 4}" y="{y + 4}" width="{g.node_w - 8}" '
                     f'height="{g.node_h - 8}" rx="6"/>')
    answer = f"{shorten(answer_text(turn.answer), 14)} {MARK[state]}".rstrip()
    parts += [svg_text(x + 10, y + 24, answer, "answer"),
              svg_text(x + 10, y + 46, sampling_label(turn), "small"),
              svg_text(x + 10, y + 66, f"{KIND_LABELS[kind]} \u00b7 {turn_tokens(turn):,} tok", "small"),
              "</g>"]
    return "".join(parts)


def anchor_y(g: Geometry, row: int, slot: int, n_agents: int) -> float:
    """Where a line meets a box: one height per agent id, so arrows into or out of one box never overlap."""
    return g.y(row) + g.node_h * (slot + 1) / (n_agents + 1)


def render_read(trace: DebateTrace, turn: AgentTurn, peer: int, marker: str, g: Geometry) -> str:
    """The arrow of one read pair: from the peer's previous box to the reader's box, coloured by whether
    the answer it carried was correct."""
    previous = trace.rounds[turn.round - 1][peer]
    state = verdict(previous.correct, gold_known(trace))
    x1, y1 = g.x(turn.round - 1) + g.node_w, anchor_y(g, peer, turn.agent, trace.n_agents)
    x2, y2 = g.x(turn.round) - 1, anchor_y(g, turn.agent, peer, trace.n_agents)
    bend = (x2 - x1) / 2
    curve = f"M{x1},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2},{y2:.1f}"
    title = (f"round {turn.round}: agent {turn.agent} read agent {peer}'s round-{turn.round - 1} answer "
             f"{answer_text(previous.answer)}")
    return (f'<path class="read {state}" data-round="{turn.round}" data-reader="{turn.agent}" '
            f'data-peer="{peer}" d="{curve}" '
            f'marker-end="url(#{marker}-{state})"><title>{esc(title)}</title></path>')


def render_own(trace: DebateTrace, turn: AgentTurn, g: Geometry) -> str:
    """The thin line from an agent's previous turn to this one (none for a fresh sample: it starts anew)."""
    if turn.fresh:
        return ""
    y = anchor_y(g, turn.agent, turn.agent, trace.n_agents)
    cls = "own keep" if turn.silent else "own"
    x1, x2 = g.x(turn.round - 1) + g.node_w, g.x(turn.round)
    return f'<line class="{cls}" x1="{x1}" y1="{y:.1f}" x2="{x2}" y2="{y:.1f}"/>'


def render_agent_label(trace: DebateTrace, agent: int, most_tokens: int, g: Geometry) -> str:
    """Agent name, its model when agents differ, its tokens as a number and as a bar (title: the split)."""
    prompt, completion = agent_tokens(trace, agent)
    y = g.y(agent)
    bar = round((g.label_w - 30) * (prompt + completion) / max(1, most_tokens))
    title = f"agent {agent}: {prompt + completion:,} tokens ({prompt:,} prompt, {completion:,} completion)"
    parts = [f'<g class="agent" data-agent="{agent}">', f"<title>{esc(title)}</title>",
             svg_text(0, y + 24, f"agent {agent}", "heading")]
    if len(set(trace.model_ids)) > 1 and agent < len(trace.model_ids):
        parts.append(svg_text(0, y + 42, shorten(trace.model_ids[agent], 26), "small"))
    parts += [svg_text(0, y + 62, f"{prompt + completion:,} tokens", "small"),
              f'<rect class="tokbar" x="0" y="{y + 68}" width="{bar}" height="6" rx="2"/>', "</g>"]
    return "".join(parts)


def vote_lines(trace: DebateTrace) -> list[tuple[str, str]]:
    """(text, css class) lines of the vote box."""
    if trace.failed:
        return [("failed", "answer"), (shorten(trace.error or "", 24), "small")]
    state = verdict(trace.final_correct, gold_known(trace))
    lines = [(f"{shorten(answer_text(trace.final_answer), 14)} {MARK[state]}".rstrip(), "answer")]
    counts = sorted(trace.vote_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    lines.append((shorten(" \u00b7 ".join(f"{k}\u00d7{n}" for k, n in counts), 26), "small"))
    if trace.tie:
        lines.append((f"tie, expected correct {trace.final_expected:.2f}" if gold_known(trace) else "tie",
                      "tie small"))
    if gold_known(trace):
        lines.append((f"gold {shorten(trace.gold, 18)}", "small"))
    return lines


def render_vote(trace: DebateTrace, g: Geometry) -> str:
    """The final vote's box, centred over the agents' rows in the last column."""
    x = g.x(len(trace.rounds))
    height = g.node_h + 10
    y = g.top + (trace.n_agents * g.row_h - g.row_h + g.node_h) / 2 - height / 2
    state = "wrong" if trace.failed else verdict(trace.final_correct, gold_known(trace))
    counts = ", ".join(f"{k}: {n}" for k, n in trace.vote_counts.items()) or "none"
    title = (f"final vote: {answer_text(trace.final_answer)}{' (tie)' if trace.tie else ''}; votes {counts}"
             + (f"; gold {trace.gold}" if gold_known(trace) else ""))
    tie = " tie" if trace.tie else ""
    parts = [f'<g class="vote {state}{tie}"><title>{esc(title)}</title>',
             f'<rect x="{x}" y="{y:.0f}" width="{g.node_w}" height="{height}" rx="8"/>']
    parts += [svg_text(x + 10, y + 24 + 20 * k, text, cls) for k, (text, cls) in enumerate(vote_lines(trace))]
    parts.append("</g>")
    return "".join(parts)


def render_markers(prefix: str) -> str:
    """Arrowheads, one per arrow colour (ids prefixed per debate so several pictures share a page)."""
    colours = {"correct": "#1a7f37", "wrong": "#cf222e", "ungraded": "#6e7781"}
    return "<defs>" + "".join(
        f'<marker id="{prefix}-{state}" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse" '
        f'markerWidth="9" markerHeight="9" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        for state, colour in colours.items()) + "</defs>"


def render_svg(trace: DebateTrace, index: int = 0, g: Geometry = Geometry()) -> str:
    """The inline SVG of one debate: round headings, agent labels, reads and own lines, turns, vote."""
    n_rounds, marker = len(trace.rounds), f"arrow{index}"
    width, height = g.width(n_rounds), g.height(trace.n_agents)
    most_tokens = max((sum(agent_tokens(trace, a)) for a in range(trace.n_agents)), default=0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(f"debate {trace.debate_id}")}">',
             render_markers(marker)]
    parts += [svg_text(g.x(r), 16, f"round {r}", "heading") for r in range(n_rounds)]
    parts.append(svg_text(g.x(n_rounds), 16, "vote", "heading"))
    parts += [render_agent_label(trace, a, most_tokens, g) for a in range(trace.n_agents)]
    for turns in trace.rounds[1:]:
        for turn in turns:
            parts.append(render_own(trace, turn, g))
            parts += [render_read(trace, turn, peer, marker, g) for peer in turn.peers]
    parts += [render_turn(trace, turn, g) for turns in trace.rounds for turn in turns]
    parts += [render_vote(trace, g), "</svg>"]
    return "\n".join(p for p in parts if p)


def debate_facts(trace: DebateTrace) -> str:
    """One line under the question: gold, vote, tokens, model, and what interventions added."""
    vote = "failed" if trace.failed else answer_text(trace.final_answer) + (" (tie)" if trace.tie else "")
    if gold_known(trace) and not trace.failed:
        vote += " \u2014 correct" if trace.final_correct else " \u2014 wrong"
    tokens = (f"tokens {trace.total_tokens:,} (prompt {trace.prompt_tokens:,}, "
              f"completion {trace.completion_tokens:,})")
    facts = [f"gold {trace.gold}" if gold_known(trace) else "gold unknown", f"final vote {vote}", tokens]
    models = sorted(set(trace.model_ids))
    if len(models) == 1:
        facts.append(f"model {models[0]}")
    if trace.extra_calls:
        calls = ", ".join(f"{c.kind} r{c.round}" for c in trace.extra_calls)
        facts.append(f"extra calls {calls} ({trace.extra_tokens:,} tokens apart)")
    return " \u00b7 ".join(facts)


LEGEND = ("Arrow from agent j (round r\u22121) to agent i (round r): agent i read agent j's answer; green "
          "when that answer was correct, red when wrong. Grey line: the agent's own previous turn (dashed: kept "
          "without a model call). Dashed box: kept turn; double box: fresh sample from the question alone. "
          "Hover a box for the whole turn.")


def render_section(trace: DebateTrace, index: int = 0) -> str:
    heading = " \u00b7 ".join(x for x in (trace.task, trace.question_id, trace.protocol) if x)
    return "\n".join([f'<section class="debate" id="debate-{index}" data-debate-id="{esc(trace.debate_id)}">',
                      f"<h1>{esc(heading)}</h1>",
                      f'<p class="question">{esc(trace.question)}</p>',
                      f'<p class="facts">{esc(debate_facts(trace))}</p>',
                      render_svg(trace, index),
                      f'<p class="legend">{esc(LEGEND)}</p>',
                      "</section>"])


def render_html(traces: Sequence[DebateTrace], command: str | None = None) -> str:
    """A self-contained HTML page with one picture per debate; `command` (how it was made) goes in the page's
    generator meta tag and a line at its foot."""
    if not traces:
        raise ValueError("render_html: no debates to draw")
    title = (f"debate {traces[0].task} {traces[0].question_id}" if len(traces) == 1
             else f"{len(traces)} debates")
    generator = f'<meta name="generator" content="{esc(command)}">\n' if command else ""
    made_by = f'\n<p class="facts">made by <code>{esc(command)}</code></p>' if command else ""
    return "".join([
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n', generator,
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n",
        "\n".join(render_section(t, k) for k, t in enumerate(traces)), made_by,
        "\n</body>\n</html>\n"])


def write_html(traces: Sequence[DebateTrace], path: str | Path, command: str | None = None) -> Path:
    """Write `render_html(traces, command)` to `path` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, render_html(traces, command))
    return path
