"""What `dear.infer` records beside its traces, and where its llama.cpp settings go (issue 59 item 4): `--out
X.jsonl` writes `X.run.json` with the command, the llama.cpp thread count and whether every backend decoded
repeatably; the repeatable one-slot setting reaches a llama.cpp backend that only an agent profile names, also when
`--llm` is not a llama.cpp backend."""

from __future__ import annotations

import json

import pytest
import torch

import dear.infer as infer
from dear.export import export_policy
from dear.llm.local import choose_threads
from dear.policy import JointPolicy, PolicyConfig
from dear.sim import SimBackend
from dear.tasks.synthetic import load_synthetic

QUESTION = load_synthetic(n=1, seed=0, split="test")[0].question


@pytest.fixture
def exported(tmp_path):
    torch.manual_seed(0)
    return export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "policy", encoder="hashing",
                         training={"n_rounds": 1, "synthetic": True, "llm": "sim"})


@pytest.fixture
def built(monkeypatch):
    """Every backend dear.infer builds is the sim (it answers the synthetic question); records spec -> options."""
    seen: dict[str, dict] = {}

    def make(spec, **options):
        seen[spec] = options
        return SimBackend(seed=0)

    monkeypatch.setattr(infer, "make_backend", make)
    return seen


def run_record(tmp_path, exported, *args: str) -> dict:
    out = tmp_path / "traces.jsonl"
    assert infer.main(["--policy", str(exported), "--question", QUESTION, "--out", str(out), *args]) == 0
    return json.loads((tmp_path / "traces.run.json").read_text())


def test_the_run_record_of_a_sim_debate_says_it_repeats_without_llama_threads(tmp_path, exported, capsys):
    record = run_record(tmp_path, exported, "--llm", "sim", "--seed", "3")
    assert record["command"].startswith("python -m dear.infer ") and "--seed 3" in record["command"]
    assert (record["llm"], record["seed"], record["policy"]) == ("sim", 3, str(exported))
    assert (record["repeatable"], record["llama_threads"], record["n_parallel"]) == (True, None, None)
    assert "traces.run.json" in capsys.readouterr().out


def test_a_llama_profile_on_another_llm_decodes_repeatably_and_the_record_says_so(tmp_path, exported, built,
                                                                                 monkeypatch):
    monkeypatch.setenv("DEAR_LLAMA_THREADS", "1")
    record = run_record(tmp_path, exported, "--llm", "sim", "--agent-profiles", "cot,cot,smoke:cot")
    assert built == {"sim": {}, "smoke": {"n_parallel": 1, "repeatable": True}}  # the sim takes no llama.cpp option
    assert (record["repeatable"], record["llama_threads"], record["n_parallel"]) == (True, 1, 1)
    assert record["agent_profiles"] == ["sim:cot", "sim:cot", "smoke:cot"]

    built.clear()
    record = run_record(tmp_path, exported, "--llm", "sim", "--agent-profiles", "cot,cot,smoke:cot",
                        "--no-repeatable")
    assert built["smoke"] == {"n_parallel": 3} and built["sim"] == {}  # one slot per agent turn of the question
    assert (record["repeatable"], record["n_parallel"]) == (False, 3)


def test_the_recorded_thread_count_is_the_one_llama_cpp_chooses(tmp_path, exported, built, monkeypatch):
    monkeypatch.delenv("DEAR_LLAMA_THREADS", raising=False)
    record = run_record(tmp_path, exported, "--llm", "smoke")
    assert record["llama_threads"] == choose_threads().threads >= 1
    assert built["smoke"] == {"n_parallel": 1, "repeatable": True}


def test_the_record_of_a_backend_that_batches_as_it_likes_is_not_repeatable():
    decoding = infer.decoding_of(["smoke", "openai:http://127.0.0.1:9/v1"], {"n_parallel": 1, "repeatable": True})
    assert not decoding.repeatable and decoding.n_parallel == 1
    assert infer.decoding_of(["bank", "sim"], {}).repeatable
