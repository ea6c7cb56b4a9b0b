"""bench/bench_throughput.py end to end on the real smoke GGUF (plumbing: its answers are nonsense)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests import ROOT

BENCH = ROOT / "bench" / "bench_throughput.py"


def test_bench_reports_ratios_and_where_slot_time_went(tmp_path, capsys, monkeypatch):
    pytest.importorskip("xllamacpp")
    monkeypatch.setenv("DEAR_LLAMA_THREADS", "1")
    spec = importlib.util.spec_from_file_location("bench_throughput", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_throughput", bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    out = tmp_path / "throughput.json"
    bench.main(["--llm", "smoke", "--questions", "1", "--parallel", "3", "--max-tokens", "16", "--n-ctx", "1024",
                "--out", str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    passes = result["passes"]
    assert [p["calls"] for p in passes] == [9, 9, 9]  # 1 question x 3 agents x (round 0 + 2 exchange rounds)
    assert passes[0]["ratio_to_raw"] == 1.0 and all(p["ratio_to_raw"] > 0 for p in passes)
    for p in passes:
        prompt, decode = p["slot_use_prompt_decode"]
        assert 0 < prompt and 0 < decode and prompt + decode <= 1.05  # timings are slot-time within the wall
    assert printed.count("% idle") == 3
    reading = result["prompt_reading"]  # the after pass's 9 chats again, one token each
    assert reading["calls"] == 9 and reading["errors"] == 0 and reading["completion_tokens"] <= 9
    assert reading["prompt_tokens"] == passes[2]["prompt_tokens"]  # the same chats, so the same prompt tokens
    limit = result["ceiling_after"]
    assert limit["prompt_tokens_per_s"] > 0 and limit["decode_tokens_per_s"] > 0 and limit["ratio"] > 0
    assert limit["share_reached"] == pytest.approx(passes[2]["ratio_to_raw"] / limit["ratio"])
    assert "of the ceiling" in printed


def test_ceiling_charges_the_debate_its_prompt_reading(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_throughput", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_throughput", bench)
    spec.loader.exec_module(bench)
    # raw: 1000 tokens in 60 s, of which 100 computed prompt tokens at 10 tok/s = 10 s -> pure decode 20 tok/s
    raw = bench.Pass("raw", 9, 60.0, 1000, 150, 50, 0)
    reading = bench.Pass("reading", 9, 20.0, 9, 400, 200, 0)  # 200 computed in 20 s -> 10 tok/s
    debate = bench.Pass("after", 9, 100.0, 1000, 1200, 700, 0)  # 500 computed -> 50 s reading + 50 s decode
    limit = bench.ceiling(raw, debate, reading)
    assert limit.prompt_tokens_per_s == pytest.approx(10.0)
    assert limit.decode_tokens_per_s == pytest.approx(20.0)
    assert limit.ratio == pytest.approx((1000 / 100) / (1000 / 60))  # best wall 100 s vs raw's 16.7 tok/s
    assert limit.share_reached == pytest.approx(1.0)  # this debate pass lost nothing to scheduling
