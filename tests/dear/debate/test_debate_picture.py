"""The picture of a debate (dear/debate/picture.py, python -m dear.show, dear.infer --html): its structure on a
hand-built trace, the CLI's answers to bad input, and a real headless Chromium drawing a real stored debate."""

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from dear.cli import command_line
from dear.debate.picture import render_html, render_svg
from dear.debate.trace import AgentTurn, DebateTrace, read_jsonl
from dear.show import find_chromium, main, run_chromium

from tests import ROOT

STORED = ROOT / "results/eval-gsm8k-n60-v2/traces/gsm8k/dear.jsonl"
STORED_QUESTION = "test-1161"  # a minority of one was right in round 0 and won the vote
SVG = "{http://www.w3.org/2000/svg}"
EVIL = "<b>&\"x'"  # an answer that must be escaped


def turn(agent, rnd, answer, correct, peers=(), silent=False, fresh=False, tokens=(10, 5)):
    return AgentTurn(agent=agent, round=rnd, messages=[], text="", reasoning="r", conclusion=f"c {answer}",
                     answer=answer, answer_key=answer, correct=correct, grader="numeric",
                     temperature=0.7 + rnd / 10, top_p=0.9, seed=rnd, peers=list(peers), prompt_tokens=0 if silent else tokens[0],
                     completion_tokens=0 if silent else tokens[1], finish_reason="stop", latency_s=0.0,
                     silent=silent, fresh=fresh)


def small_trace(gold="3"):
    """3 agents, 3 rounds: reads of several shapes, a kept turn, a fresh sample, an escaped answer, a tie."""
    t = DebateTrace(debate_id="t/q1/s0", question_id="q1", task="toy", question="1 + 2 < 4?", gold=gold,
                    kind="numeric", model_ids=["m"] * 3, protocol="dear")
    t.add_round([turn(0, 0, "3", True), turn(1, 0, EVIL, False), turn(2, 0, None, False)])
    t.add_round([turn(0, 1, "3", True, peers=[1, 2]), turn(1, 1, "3", True, peers=[0]),
                 turn(2, 1, None, False, silent=True)])
    t.add_round([turn(0, 2, "3", True, peers=[2]), turn(1, 2, "4", False, fresh=True),
                 turn(2, 2, "5", False, peers=[0, 1])])
    t.final_answer, t.final_correct, t.tie, t.final_score = "3", True, True, 1 / 3
    t.vote_counts = {"3": 1, "4": 1, "5": 1}
    return t


def read_pairs(trace):
    return {(r, t.agent, j) for r, turns in enumerate(trace.rounds) for t in turns for j in t.peers}


def groups(svg, cls):
    return [g for g in svg.iter(f"{SVG}g") if cls in g.get("class", "").split()]


def test_one_arrow_per_read_pair_and_a_box_per_turn():
    trace = small_trace()
    svg = ET.fromstring(render_svg(trace))  # well-formed XML: everything escaped
    arrows = [p for p in svg.iter(f"{SVG}path") if "read" in p.get("class", "").split()]
    assert len(arrows) == 6 == len(read_pairs(trace))
    assert {(int(p.get("data-round")), int(p.get("data-reader")), int(p.get("data-peer"))) for p in arrows} \
        == read_pairs(trace)
    # each arrow is coloured by the answer it carried: round-1 agent 0 read agent 1's wrong round-0 answer
    colour = {(p.get("data-round"), p.get("data-reader"), p.get("data-peer")): p.get("class") for p in arrows}
    assert colour["1", "0", "1"] == "read wrong" and colour["2", "2", "0"] == "read correct"
    assert len(groups(svg, "turn")) == 9


def test_kept_and_fresh_turns_look_different():
    svg = ET.fromstring(render_svg(small_trace()))
    kept, fresh = groups(svg, "keep"), groups(svg, "fresh")
    assert [(g.get("data-round"), g.get("data-agent")) for g in kept] == [("1", "2")]
    assert [(g.get("data-round"), g.get("data-agent")) for g in fresh] == [("2", "1")]
    assert len(fresh[0].findall(f"{SVG}rect")) == 2  # the double box
    own = [line.get("class") for line in svg.iter(f"{SVG}line")]
    assert own.count("own keep") == 1 and len(own) == 5  # 6 later turns, the fresh one starts anew


def test_answers_are_escaped_marked_and_the_tie_shown():
    trace = small_trace()
    page = render_html([trace], command="python -m dear.show x.jsonl --html <y>.html")
    assert "<b>" not in page and "&lt;b&gt;&amp;&quot;x&#x27;" in page
    assert "&lt;y&gt;.html" in page and "<y>" not in page
    svg = ET.fromstring(render_svg(trace))
    answers = {(g.get("data-round"), g.get("data-agent")): g.find(f"{SVG}text").text for g in groups(svg, "turn")}
    assert answers["0", "1"] == f"{EVIL} \u2717" and answers["0", "0"] == "3 \u2713"
    assert answers["0", "2"] == "no answer \u2717"
    vote = groups(svg, "vote")[0]
    assert vote.get("class") == "vote correct tie"
    assert any(t.text.startswith("tie") for t in vote.iter(f"{SVG}text"))


def test_temperature_top_p_and_tokens_per_turn_and_agent():
    svg = ET.fromstring(render_svg(small_trace()))
    first = groups(svg, "turn")[0]
    texts = [t.text for t in first.iter(f"{SVG}text")]
    assert "T 0.70 \u00b7 top-p 0.90" in texts and "sample \u00b7 15 tok" in texts
    assert "tokens: 10 prompt + 5 completion" in first.find(f"{SVG}title").text  # on hover
    labels = {g.get("data-agent"): [t.text for t in g.iter(f"{SVG}text")] for g in groups(svg, "agent")}
    assert "45 tokens" in labels["0"] and "30 tokens" in labels["2"]  # the kept turn cost nothing


def test_a_kept_turn_shows_no_temperature_or_top_p():
    """Issue 59 item 3: a kept turn made no model call, so the T and top-p the policy set for it were never used
    and are not shown (box or hover); every turn with a call shows its own."""
    svg = ET.fromstring(render_svg(small_trace()))
    for g in groups(svg, "turn"):
        texts = [t.text for t in g.iter(f"{SVG}text")]
        title = g.find(f"{SVG}title").text
        if "keep" in g.get("class").split():
            assert "no call" in texts and not any(t.startswith("T ") for t in texts)
            assert "top-p" not in title and "no model call" in title
        else:
            assert any(t.startswith("T ") and "top-p" in t for t in texts) and "top-p" in title


def test_unknown_gold_is_not_marked():
    svg = ET.fromstring(render_svg(small_trace(gold="")))
    classes = " ".join(g.get("class") for g in groups(svg, "turn"))
    assert "correct" not in classes and "wrong" not in classes
    assert "\u2713" not in ET.tostring(svg, encoding="unicode")


def test_the_page_is_self_contained():
    page = render_html([small_trace(), small_trace()])
    assert "<script" not in page and "<link" not in page and "src=" not in page
    assert set(re.findall(r"\w+://[^\s\"')]+", page)) == {"http://www.w3.org/2000/svg"}  # the SVG namespace only
    assert page.count("<svg") == 2 and 'id="arrow0-correct"' in page and 'id="arrow1-correct"' in page
    with pytest.raises(ValueError, match="no debates"):
        render_html([])


def test_show_draws_a_stored_debate(tmp_path, capsys):
    out = tmp_path / "d.html"
    assert main([str(STORED), "--question", STORED_QUESTION, "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    trace = next(t for t in read_jsonl(STORED) if t.question_id == STORED_QUESTION)
    assert page.count('<path class="read') == len(read_pairs(trace)) > 0
    assert f'<meta name="generator" content="python -m dear.show {STORED}' in page


def test_show_names_a_missing_file_an_unknown_question_and_a_bad_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such trace file"):
        main([str(tmp_path / "nope.jsonl"), "--html", str(tmp_path / "x.html")])
    unknown = r"no debate of question 'test-0'; its questions: test-\d+, .*\(60 in all\)"
    with pytest.raises(ValueError, match=unknown):
        main([str(STORED), "--question", "test-0", "--html", str(tmp_path / "x.html")])
    with pytest.raises(ValueError, match="choose one with --question"):
        main([str(STORED), "--html", str(tmp_path / "x.html")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(small_trace().to_json() + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{re.escape(str(bad))}:2: not a DebateTrace"):
        main([str(bad), "--html", str(tmp_path / "x.html")])
    r = subprocess.run([sys.executable, "-m", "dear.show", str(bad), "--html", str(tmp_path / "x.html")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.startswith(f"python -m dear.show: error: {bad}:2:")
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.html").exists()


def test_a_file_of_one_question_needs_no_question_flag(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(small_trace().to_json() + "\n", encoding="utf-8")
    assert main([str(one), "--html", str(tmp_path / "one.html")]) == 0
    assert (tmp_path / "one.html").read_text(encoding="utf-8").count('<path class="read') == 6


def test_infer_html_draws_the_debates_it_ran(tmp_path, capsys):
    import torch

    from dear.export import export_policy
    from dear.infer import main as infer_main
    from dear.policy import JointPolicy, PolicyConfig

    torch.manual_seed(0)
    policy = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "policy", encoder="hashing",
                           training={"n_rounds": 2, "synthetic": True, "llm": "sim"})
    out, page = tmp_path / "t.jsonl", tmp_path / "t.html"
    argv = ["--policy", str(policy), "--llm", "sim", "--question", "What is 2 + 3?", "--kind", "integer",
            "--out", str(out), "--html", str(page)]
    infer_main(argv)
    html = page.read_text(encoding="utf-8")
    # the same renderer as dear.show, on the trace --out wrote
    assert html == render_html(read_jsonl(out), command=command_line("python -m dear.infer", argv))
    assert "gold unknown" in html and html.count("<svg") == 1


@pytest.mark.skipif(find_chromium() is None,
                    reason="no Chromium binary on PATH (Debian: apt-get install chromium)")
def test_headless_chromium_draws_a_real_stored_debate(tmp_path):
    from PIL import Image  # Pillow comes with matplotlib

    page, png = tmp_path / "debate.html", tmp_path / "debate.png"
    assert main([str(STORED), "--question", STORED_QUESTION, "--html", str(page), "--png", str(png)]) == 0
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (1400, 900)
        colours = {c for _, c in im.convert("RGB").getcolors(maxcolors=1 << 20)}
    assert len(colours) > 50  # not blank
    assert {(218, 251, 225), (255, 235, 233)} <= colours  # boxes of correct and of wrong answers were drawn
    dom = run_chromium(page, "--dump-dom")
    trace = next(t for t in read_jsonl(STORED) if t.question_id == STORED_QUESTION)
    assert all(f"agent {a}</text>" in dom for a in range(trace.n_agents))
    assert len(re.findall(r'<path class="read (?:correct|wrong)"', dom)) == len(read_pairs(trace)) == 6
    assert dom.count('class="turn ') == 9 and "170 \u2713" in dom
