"""Seeds that repeat on the embedded model (slow): the same `dear.infer` command run twice, the second time while
another process holds a core, prints the same debate (issue 59: it once gave `391, 491, 491` and then
`391, 301, 391`). `dear.infer` decodes repeatably by default (dear/llm/local.py, `repeatable`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dear.debate.trace import read_jsonl

QUESTION = "A shop sells 17 boxes of 23 pencils each. How many pencils does it sell?"


def infer_texts(out: Path) -> list[list[str]]:
    """Run `python -m dear.infer` (the shipped policy, 3 agents, 1 exchange round, 64 tokens a reply, seed 0) on the
    embedded model in a fresh process; the text of every turn of its debate, round by round."""
    command = [sys.executable, "-m", "dear.infer", "--llm", "local", "--question", QUESTION, "--kind", "integer",
               "--n-rounds", "1", "--max-tokens", "64", "--seed", "0", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "repeatable" in done.stderr  # the backend said how it decodes
    (trace,) = read_jsonl(out)
    return [[turn.text for turn in turns] for turns in trace.rounds]


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_the_same_seed_prints_the_same_debate_with_a_core_busy(tmp_path):
    quiet = infer_texts(tmp_path / "quiet.jsonl")
    busy_loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = infer_texts(tmp_path / "busy.jsonl")
    finally:
        busy_loop.kill()
        busy_loop.wait()
    assert quiet and all(quiet[0])  # every agent answered in round 0 (the policy may stop the debate after it)
    assert busy == quiet
