"""bench/bench_serve.py end to end: a real `python -m dear.serve --llm sim` subprocess and a few AsyncOpenAI
clients (the committed run uses 200: results/bench-serve/)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests import ROOT

BENCH = ROOT / "bench" / "bench_serve.py"


def test_bench_answers_every_client_and_reports_the_command_and_seed(tmp_path, capsys, monkeypatch):
    pytest.importorskip("openai")
    spec = importlib.util.spec_from_file_location("bench_serve", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_serve", bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    argv = ["--clients", "6", "--max-active", "4", "--model", "mad", "--seed", "3", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["answered"] == 6 and summary["errors"] == 0 and summary["seed"] == 3
    assert summary["command"] == "python bench/bench_serve.py " + " ".join(argv)
    assert "--llm sim" in summary["server_command"] and "--max-active 4" in summary["server_command"]
    assert 0 < summary["latency_p50_s"] <= summary["latency_p95_s"] <= summary["latency_max_s"]
    sched = summary["scheduler"]
    # 6 MAD debates of 3 rounds, at most 4 at once: every round of every debate ran, in shared steps.
    assert sched["debates_finished"] == 6 and sched["debate_rounds"] == 18 and sched["steps"] < 18
    assert sched["backend_calls"] <= sched["steps"]
    assert "6 answered, 0 errors" in printed and "command: python bench/bench_serve.py" in printed
    assert "seed: 3" in printed
