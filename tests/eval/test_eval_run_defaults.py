"""`eval.run`'s defaults and first checks (issue 59): without `--out` it writes under runs/eval/, never into the
committed results/; a wrong benchmark is named before anything about the checkpoint; the llama.cpp thread count
is recorded in run.json and reused by later runs of the directory."""

from __future__ import annotations

import json
import os

import pytest

from dear.sim import SimBackend
from eval import run as eval_run
from eval.methods import parse_methods


def test_without_out_the_results_go_under_runs_eval_not_results():
    a = eval_run.parse_args(["--benchmarks", "gsm8k,math", "--n", "5", "--methods", "cot", "--llm", "sim"])
    settings = eval_run.settings_from_args(a, None, parse_methods("cot"))
    assert settings.out == "runs/eval/eval-gsm8k-math500-n5-s0"
    assert not settings.out.startswith("results")
    a = eval_run.parse_args(["--benchmarks", "gsm8k", "--methods", "cot", "--out", "results/mine"])
    assert eval_run.settings_from_args(a, None, parse_methods("cot")).out == "results/mine"  # when --out names it


def test_the_default_directory_is_written_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    eval_run.main(["--benchmarks", "synthetic", "--n", "2", "--methods", "cot", "--llm", "sim", "--batch", "2",
                   "--n-boot", "50", "--no-progress"], backend=SimBackend())
    assert (tmp_path / "runs/eval/eval-synthetic-n2-s0/summary.md").exists()
    assert not (tmp_path / "results").exists()


def test_an_unknown_benchmark_is_named_before_the_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"unknown benchmark\(s\) \['gsm9k'\]"):
        eval_run.main(["--benchmarks", "gsm9k", "--methods", "dear", "--llm", "sim", "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match=r"unknown benchmark\(s\) \['gsm9k'\]"):
        eval_run.main(["--benchmarks", "gsm9k", "--methods", "dear", "--llm", "sim", "--checkpoint",
                       str(tmp_path / "no-such-run"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_the_llama_thread_count_is_recorded_and_reused(tmp_path, monkeypatch):
    monkeypatch.delenv("DEAR_LLAMA_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert eval_run.llama_threads_for(["sim"], None) == (None, None)
    threads, note = eval_run.llama_threads_for(["smoke"], None)
    assert threads == 3 and "recorded in run.json" in note
    assert eval_run.llama_threads_for(["sim", "local:/m.gguf"], 2)[0] == 2  # the directory's count, reused
    monkeypatch.setenv("DEAR_LLAMA_THREADS", "1")
    threads, note = eval_run.llama_threads_for(["smoke"], 2)
    assert threads == 1 and "not the 2 recorded" in note

    # Through main: a run on --llm smoke (its backend replaced by the sim here) records the count in run.json;
    # the next run of the directory reuses the recorded one.
    monkeypatch.delenv("DEAR_LLAMA_THREADS")
    out = tmp_path / "res"
    argv = ["--benchmarks", "synthetic", "--n", "2", "--methods", "cot", "--llm", "smoke", "--batch", "2",
            "--n-boot", "50", "--no-progress", "--out", str(out)]
    eval_run.main(argv, backend=SimBackend())
    stored = json.loads((out / "run.json").read_text())
    assert stored["settings"]["llama_threads"] == 3
    stored["settings"]["llama_threads"] = 2
    (out / "run.json").write_text(json.dumps(stored))
    seen = []
    real = eval_run.Evaluator.__init__

    def spy(self, settings, *args, **kw):
        seen.append(settings.llama_threads)
        real(self, settings, *args, **kw)

    monkeypatch.setattr(eval_run.Evaluator, "__init__", spy)
    eval_run.main(argv, backend=SimBackend())
    assert seen == [2] and json.loads((out / "run.json").read_text())["settings"]["llama_threads"] == 2

    # the count reaches the llama.cpp backends only
    import dear.llm.registry

    built = {}
    monkeypatch.setattr(dear.llm.registry, "make_backend", lambda spec, **kw: built.update({spec: kw}) or SimBackend())
    a = eval_run.parse_args([*argv[:-1], str(tmp_path / "other"), "--no-cache"])
    settings = eval_run.settings_from_args(a, None, parse_methods("cot"))
    settings.llama_threads = 2
    ev = eval_run.Evaluator(settings, parse_methods("cot"), None)
    ev._make_backend("smoke")
    ev._make_backend("sim")
    assert built["smoke"]["n_threads"] == 2 and "n_threads" not in built["sim"]
