"""eval.run end-to-end on the sim backend (all methods, resumable), bad inputs, and a slow real-model run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from dear.policy import JointPolicy, PolicyConfig
from eval import run as eval_run
from dear.debate.sampling_rules import samples_needed
from eval.methods import METHODS, parse_methods
from tests import ROOT

ALL = ",".join(METHODS)


def make_train_checkpoint(root: Path, n_agents: int = 3, llm_preset: str = "sim", encoder: str = "hashing",
                          temperature_range=(0.1, 1.2), weights_agents: int | None = None) -> Path:
    """A run directory written by the trainer's own `save_checkpoint` (an untrained learner: eval only needs
    the format). `weights_agents` != n_agents builds weights for another V under the same config."""
    import yaml

    from dear.policy import Critic
    from dear.regulator import state_dim
    from train.algorithm import HAPPO
    from train.checkpoint import Counters, save_checkpoint
    from train.config import HAPPOConfig, TrainConfig

    cfg = TrainConfig()
    cfg.llm.preset = llm_preset
    cfg.env.task, cfg.env.n_agents, cfg.env.n_rounds, cfg.env.encoder = "synthetic", n_agents, 2, encoder
    cfg.env.temperature_range = tuple(temperature_range)
    v = weights_agents or n_agents
    torch.manual_seed(0)
    pol = JointPolicy(PolicyConfig(n_agents=v, temperature_range=tuple(temperature_range)))
    learner = HAPPO(pol, Critic(state_dim(v)), HAPPOConfig())
    save_checkpoint(root, learner, Counters(iteration=3), yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return root


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_train_checkpoint(tmp_path_factory.mktemp("run"))


def _args(out: Path, ckpt: Path, *extra: str, methods: str = ALL, n: int = 5) -> list[str]:
    return ["--checkpoint", str(ckpt), "--benchmarks", "synthetic", "--n", str(n), "--llm", "sim",
            "--methods", methods, "--seed", "0", "--out", str(out), "--batch", "3", "--sc-samples", "5",
            "--n-boot", "200", "--no-progress", *extra]


def test_sim_end_to_end_all_methods(tmp_path, ckpt):
    out = tmp_path / "res"
    results = eval_run.main(_args(out, ckpt))
    assert {r.method for r in results} == set(METHODS)
    rules = json.loads((out / "run.json").read_text())["vote_rules"]  # each method's vote rule, recorded
    # the baselines' and this (paper's) policy's; the confidence rules weigh their votes (equally here: the stylised
    # sim sends no log-probabilities, and each of their turns records that)
    assert rules == {m: "confidence-weighted" if METHODS[m].reads_confidence else "last-round" for m in METHODS}
    for m in METHODS:
        lines = (out / "traces" / "synthetic" / f"{m}.jsonl").read_text().splitlines()
        assert len(lines) == 5
        assert {json.loads(x)["decision"] for x in lines} == {rules[m]}  # and in every trace (MAD-stop's too)
    reg = (out / "traces" / "synthetic" / "dear.regulator.jsonl").read_text().splitlines()
    first = json.loads(reg[0])
    assert len(first["decisions"]) == 2 and len(first["decisions"][0]["mask"]) == 3  # R decisions, V x V mask
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert len(rows) == len(METHODS)
    by = {r["method"]: r for r in rows}
    assert by["cot"]["hcr_den"] == "0" and by["mad"]["acc_round2"] != ""
    md = (out / "summary.md").read_text()
    assert "SYNTHETIC" in md and "python -m eval.run" in md and "HCR narrow" in md and "Shared work" in md
    assert "**Questions reported:** synthetic: 5" in md and "Policy actions:** deterministic" in md
    assert "Paired difference to MAD" in md and "Paired difference to Round-0 majority" in md
    assert "Generation time per benchmark" in md and "truncated % (no answer)" in md
    for png in ("accuracy_vs_tokens.png", "round_accuracy.png", "transitions.png", "conformity.png"):
        p = out / png
        assert p.exists() and p.stat().st_size > 10_000, png
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Shared work is real: every method's round 0 is the stored one (single CoT = agent 0, majority = the
    # first V, self-consistency = the first 5, adaptive self-consistency the first 3 to 5, debates the first V).
    from dear.debate.trace import read_jsonl

    round0 = {t.question_id: t for t in read_jsonl(out / "traces" / "synthetic" / "round0.jsonl")}
    assert len(round0) == 5 and all(t.n_agents == 5 for t in round0.values())  # max(V=3, sc_samples=5)
    for m in METHODS:
        for t in read_jsonl(out / "traces" / "synthetic" / f"{m}.jsonl"):
            width = {"cot": 1, "sc": 5}.get(m, 3) if not METHODS[m].rule else len(t.rounds[0])
            rule = METHODS[m].rule  # a rule reads from its first stop (e.g. 2 samples from 1 until 2 agree) to 5
            assert not rule or samples_needed(rule, 3) <= width <= 5, m
            assert [a.text for a in t.rounds[0]] == [a.text for a in round0[t.question_id].rounds[0][:width]], m
    tr = {m: {t.question_id: t for t in read_jsonl(out / "traces" / "synthetic" / f"{m}.jsonl")}
          for m in ("cot", "majority", "mad")}
    for q, mad in tr["mad"].items():
        assert mad.prompt_tokens > tr["majority"][q].prompt_tokens > tr["cot"][q].prompt_tokens
    assert "DEAR (sim-trained)" in md and by["dear"]["label"] == "DEAR (sim-trained)"
    assert by["dear-random-mask"]["label"] == "DEAR random-mask (sim-trained)"


def test_resume_skips_finished_questions(tmp_path, ckpt):
    out = tmp_path / "res"
    eval_run.main(_args(out, ckpt, methods="majority,mad"))
    trace_file = out / "traces" / "synthetic" / "mad.jsonl"
    before = trace_file.read_text()
    # simulate an interrupted run: the last batch (questions 4-5, batch=3) was never marked done
    done = (out / "done.tsv").read_text().splitlines()
    (out / "done.tsv").write_text("\n".join(d for d in done if not (d.startswith("synthetic\tmad") and
                                                                    d in done[-2:])) + "\n")
    n_done_mad = sum(1 for d in (out / "done.tsv").read_text().splitlines() if "\tmad\t" in d)
    assert n_done_mad == 3
    # the report of an unfinished run compares methods on the questions all of them finished
    partial = eval_run.main(_args(out, ckpt, "--report-only", methods="majority,mad"))
    assert [r.summary.n for r in partial] == [3, 3]
    assert "--report-only" not in (out / "summary.md").read_text()  # names the command that made the traces
    eval_run.main(_args(out, ckpt, methods="majority,mad"))
    after = trace_file.read_text().splitlines()
    assert len(after) == 7  # 5 + the redone batch of 2 (appended; the report keeps the latest)
    assert after[:5] == before.splitlines()
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["n"] for r in rows] == ["5", "5"]
    # the redone batch started from the stored round 0 (not generated again) and its exchange rounds came
    # from the response cache: identical answers
    redone = [json.loads(x) for x in after[5:]]
    round0 = {json.loads(x)["question_id"]: json.loads(x)
              for x in (out / "traces" / "synthetic" / "round0.jsonl").read_text().splitlines()}
    assert len(round0) == 5
    assert all([a["text"] for a in t["rounds"][0]] == [a["text"] for a in round0[t["question_id"]]["rounds"][0]]
               for t in redone)
    assert all(t["rounds"][1][0]["cached"] for t in redone)
    texts = [[[a["text"] for a in r] for r in json.loads(x)["rounds"]] for x in after[5:]]
    assert texts == [[[a["text"] for a in r] for r in json.loads(x)["rounds"]] for x in before.splitlines()[3:]]
    # a third run with nothing left to do does not build a backend at all
    eval_run.main(_args(out, ckpt, "--llm", "sim", methods="majority,mad"))
    assert len(trace_file.read_text().splitlines()) == 7


def test_settings_mismatch_in_same_dir(tmp_path, ckpt):
    out = tmp_path / "res"
    eval_run.main(_args(out, ckpt, methods="cot", n=2))
    bad = _args(out, ckpt, methods="cot", n=2)
    bad[bad.index("--seed") + 1] = "1"
    with pytest.raises(ValueError, match="different settings.*seed: 0 there vs 1 now"):
        eval_run.main(bad)
    # a larger --n extends the same seeded subset: the first questions are reused, not recomputed
    results = eval_run.main(_args(out, ckpt, methods="cot", n=4))
    assert results[0].summary.n == 4
    assert len((out / "traces" / "synthetic" / "cot.jsonl").read_text().splitlines()) == 4


def test_baselines_extend_a_directory_evaluated_with_a_policy(tmp_path, ckpt):
    """Baselines run later (or for more questions) in a DEAR directory, with or without --checkpoint: the
    directory's policy stays its policy, and a later run or report without --checkpoint uses it."""
    out = tmp_path / "res"
    eval_run.main(_args(out, ckpt, methods="majority,dear", n=2))
    eval_run.main(_args(out, ckpt, methods="majority,mad", n=3))  # with the same --checkpoint
    no_ckpt = _args(out, ckpt, methods="mad,dear", n=4)
    del no_ckpt[:2]
    results = eval_run.main(no_ckpt)
    assert all(r.summary.n == 4 for r in results)
    labels = {r.method: r.label for r in results}
    assert labels["dear"].startswith("DEAR (") and labels["mad"] == "MAD"
    assert json.loads((out / "run.json").read_text())["settings"]["checkpoint"] == str(ckpt.resolve())
    other = make_train_checkpoint(tmp_path / "other", temperature_range=(0.2, 1.0))
    with pytest.raises(ValueError, match="different settings.*checkpoint"):
        eval_run.main(_args(out, other, methods="dear", n=2))


def test_a_directory_of_baselines_takes_the_first_policy_run_in_it(tmp_path, ckpt):
    """Baselines first (no --checkpoint), DEAR later in the same directory on the same stored round 0: the first
    policy becomes the directory's, and another one is refused after it."""
    out = tmp_path / "res"
    no_ckpt = _args(out, ckpt, methods="majority,mad", n=2)
    del no_ckpt[:2]
    eval_run.main(no_ckpt)
    assert json.loads((out / "run.json").read_text())["settings"]["checkpoint"] is None
    round0 = (out / "traces" / "synthetic" / "round0.jsonl").read_text()
    results = eval_run.main(_args(out, ckpt, methods="majority,mad,dear", n=2))
    assert {r.method: r.summary.n for r in results} == {"majority": 2, "mad": 2, "dear": 2}
    assert (out / "traces" / "synthetic" / "round0.jsonl").read_text() == round0  # DEAR continued the stored one
    assert json.loads((out / "run.json").read_text())["settings"]["checkpoint"] == str(ckpt.resolve())
    other = make_train_checkpoint(tmp_path / "other", temperature_range=(0.2, 1.0))
    with pytest.raises(ValueError, match="different settings.*checkpoint"):
        eval_run.main(_args(out, other, methods="dear", n=2))


def test_benchmark_aliases_resolve_to_task_names():
    a = eval_run.parse_args(["--benchmarks", "gpqa,math", "--methods", "cot", "--llm", "sim"])
    settings = eval_run.settings_from_args(a, None, parse_methods("cot"))
    assert settings.benchmarks == ["gpqa_diamond", "math500"]


def test_bad_inputs(tmp_path, ckpt):
    out = tmp_path / "res"
    with pytest.raises(ValueError, match=r"unknown benchmark\(s\) \['nope'\]"):
        eval_run.main(["--benchmarks", "synthetic,nope", "--methods", "cot", "--llm", "sim", "--out", str(out)])
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['madd'\]; known methods: cot"):
        eval_run.main(["--benchmarks", "synthetic", "--methods", "cot,madd", "--llm", "sim", "--out", str(out)])
    with pytest.raises(ValueError, match=r"need --checkpoint"):
        eval_run.main(["--benchmarks", "synthetic", "--methods", "dear", "--llm", "sim", "--out", str(out)])
    with pytest.raises(FileNotFoundError, match="no such file"):
        eval_run.main(_args(out, tmp_path / "missing", methods="dear"))
    empty_run = tmp_path / "empty_run"
    (empty_run / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no finished checkpoint"):
        eval_run.main(_args(out, empty_run, methods="dear"))
    with pytest.raises(ValueError, match="trained for V=3 agents but --n-agents=4"):
        eval_run.main(_args(out, ckpt, "--n-agents", "4", methods="dear"))
    with pytest.raises(ValueError, match=r"temperature range \[0.1, 1.2\] but --temperature-range=\[0.2, 1.0\]"):
        eval_run.main(_args(out, ckpt, "--temperature-range", "0.2,1.0", methods="dear"))
    # weights for V=4 under a config that says V=3
    bad = make_train_checkpoint(tmp_path / "bad", n_agents=3, weights_agents=4)
    with pytest.raises(ValueError, match="weights do not fit a policy with n_agents=3"):
        eval_run.main(_args(tmp_path / "res2", bad, methods="dear"))
    with pytest.raises(ValueError, match="--n must be >= 0"):
        eval_run.main(["--benchmarks", "synthetic", "--methods", "cot", "--n", "-1", "--llm", "sim",
                       "--out", str(out)])


def test_cli_exit_code_on_bad_input(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "eval.run", "--benchmarks", "nope", "--methods", "cot",
                        "--llm", "sim", "--out", str(tmp_path / "r")], capture_output=True, text=True, check=False,
                       cwd=ROOT)
    assert p.returncode == 2 and "unknown benchmark" in p.stderr


@pytest.mark.slow
def test_real_model_two_questions(tmp_path):
    """The smoke model through llama.cpp: 2 GSM8K questions, single CoT, majority and MAD, 1 exchange round."""
    out = tmp_path / "real"
    ckpt = make_train_checkpoint(tmp_path / "run", llm_preset="smoke", encoder="minilm")
    results = eval_run.main(["--checkpoint", str(ckpt), "--benchmarks", "gsm8k", "--n", "2", "--llm", "smoke",
                             "--methods", "cot,majority,mad,dear", "--n-rounds", "1", "--max-tokens", "96",
                             "--out", str(out), "--no-progress", "--n-boot", "200"])
    assert len(results) == 4
    md = (out / "summary.md").read_text()
    assert "SYNTHETIC" not in md and "smollm2" in md.lower()
    for r in results:
        assert r.summary.n == 2 and r.summary.total_tokens.mean > 0
    assert (out / "accuracy_vs_tokens.png").stat().st_size > 10_000


def test_exported_policy_checkpoint(tmp_path):
    from dear.export import MANIFEST_FILE, export_policy

    art = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "art", encoder="hashing",
                        training={"llm": "sim", "task": "synthetic", "synthetic": True, "n_rounds": 2})
    results = eval_run.main(_args(tmp_path / "res", art, methods="mad,dear", n=3))
    assert [r.summary.n for r in results] == [3, 3]
    assert "trained with sim on synthetic" in (tmp_path / "res" / "summary.md").read_text()
    assert results[1].label == "DEAR (sim-trained)"
    # a manifest whose V disagrees with its policy config
    m = json.loads((art / MANIFEST_FILE).read_text())
    m["n_agents"] = 4
    (art / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(ValueError, match="n_agents 4 != policy_config.n_agents 3"):
        eval_run.main(_args(tmp_path / "res2", art, methods="dear", n=3))
    # a directory that is neither a run, a checkpoint nor an export
    (tmp_path / "junk").mkdir()
    with pytest.raises(ValueError, match="not a usable DEAR policy"):
        eval_run.main(_args(tmp_path / "res3", tmp_path / "junk", methods="dear", n=3))


def test_error_bars_clip_an_interval_that_misses_its_estimate():
    from types import SimpleNamespace

    from eval.plots import _bar

    ci = SimpleNamespace(mean=0.5, low=0.5 + 1e-12, high=0.7)  # float rounding of a bootstrap percentile
    below, above = _bar(ci, 100.0)
    assert below == [0.0] and abs(above[0] - 20.0) < 1e-9
