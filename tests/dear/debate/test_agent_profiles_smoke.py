"""A mixed pool against the real smoke model (SmolLM2-135M through llama.cpp), end to end through eval.run. Marked
slow (the project's real-model marker)."""

from __future__ import annotations

import json

import pytest

from dear.debate import prompts

pytestmark = pytest.mark.slow


def test_a_mixed_cot_and_direct_debate_on_the_smoke_model(tmp_path):
    from eval import run as eval_run

    out = tmp_path / "mixed"
    mad, strongest = eval_run.main([
        "--benchmarks", "gsm8k", "--n", "1", "--llm", "smoke", "--methods", "mad,read-strongest",
        "--agent-profiles", "smoke:cot,smoke:direct:24", "--n-rounds", "1", "--max-tokens", "48",
        "--parallel", "2", "--out", str(out), "--no-progress", "--n-boot", "50"])
    assert mad.summary.n == 1 and mad.summary.failed == 0
    (trace,) = [json.loads(line) for line in (out / "traces" / "gsm8k" / "mad.jsonl").read_text().splitlines()]
    assert trace["model_ids"] == ["smoke:smollm2-135m-instruct-q4_1"] * 2
    for turns in trace["rounds"]:
        cot, direct = turns
        assert (cot["profile"], cot["style"], direct["profile"], direct["style"]) == \
            ("smoke:cot", "cot", "smoke:direct:24", "direct")
        assert cot["error"] is None and direct["error"] is None and cot["text"] and direct["text"]
        assert 0 < cot["completion_tokens"] <= 48 and 0 < direct["completion_tokens"] <= 24
        assert direct["max_tokens"] == 24 and cot["max_tokens"] == 48
        # each agent is asked in its own style in every turn
        assert prompts.DIRECT_STRUCTURE in direct["messages"][1]["content"]
        assert prompts.STRUCTURE in cot["messages"][1]["content"]
        assert direct["messages"][-1]["content"].endswith(prompts.STYLES["direct"].instructions(
            _question(trace)))
    assert trace["rounds"][1][0]["peers"] == [1] and trace["rounds"][1][1]["peers"] == [0]
    # the hand rule: the direct agent reads the cot agent, which reads nobody
    assert strongest.summary.n == 1 and strongest.summary.failed == 0
    rules = (out / "traces" / "gsm8k" / "read-strongest.jsonl").read_text().splitlines()
    (rule,) = [json.loads(line) for line in rules]
    assert rule["rounds"][1][0]["peers"] == [] and rule["rounds"][1][1]["peers"] == [0]
    md = (out / "summary.md").read_text()
    assert "## Per agent" in md and "`smoke:direct:24`" in md and "`smoke:cot`" in md


def _question(trace):
    from dear.tasks.types import Question

    return Question(id=trace["question_id"], task=trace["task"], question=trace["question"], gold=trace["gold"],
                    kind=trace["kind"])
