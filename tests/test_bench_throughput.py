"""bench/bench_throughput.py end to end on the real smoke GGUF (plumbing: its answers are nonsense)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_throughput.py"


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
