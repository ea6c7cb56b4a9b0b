"""Inference API (docs/DESIGN.md §10): an exported policy regulates debates without trainer, Ray or gym."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from dear.export import export_policy
from dear.infer import RegulatedDebater, main, make_question
from dear.policy import JointPolicy, PolicyConfig
from dear.sim import SimBackend
from dear.tasks import load_jsonl
from dear.tasks.synthetic import load_synthetic


@pytest.fixture
def exported(tmp_path):
    torch.manual_seed(0)
    policy = JointPolicy(PolicyConfig(n_agents=3))
    with torch.no_grad():  # non-trivial deterministic masks
        torch.nn.init.normal_(policy.selection.net[-1].weight, std=2.0)
    return export_policy(policy, tmp_path / "policy", encoder="hashing",
                         training={"n_rounds": 2, "synthetic": True, "llm": "sim"})


def test_debater_applies_the_policy_decisions_on_the_sim(exported):
    questions = load_synthetic(n=4, seed=0, split="test")
    with RegulatedDebater(exported, SimBackend(seed=0), seed=0) as debater:
        assert debater.config.n_rounds == 2  # from the manifest's training settings
        results = debater.run(questions)
    assert [r.question_id for r in results] == [q.id for q in questions]
    for r in results:
        assert len(r.answers_per_round) == 3 and all(len(k) == 3 for k in r.answers_per_round)
        assert [c.round for c in r.controls] == [1, 2]
        for c in r.controls:
            turns = r.trace.rounds[c.round]
            assert [t.peers for t in turns] == [list(np.flatnonzero(row)) for row in c.mask]
            assert np.allclose([t.temperature for t in turns], c.temperature)
        assert r.correct is not None and r.correct == r.trace.final_correct  # gold known: graded
        assert r.answer == r.trace.final_answer and r.prompt_tokens > 0


def test_unknown_gold_is_not_graded_and_bad_questions_are_refused():
    q = make_question("What is 2 + 3?", kind="integer")
    assert q.gold == "" and q.kind == "integer"
    with pytest.raises(ValueError, match="unknown answer kind"):
        make_question("x", kind="essay")
    with pytest.raises(ValueError, match="non-empty"):
        make_question("  ")
    with pytest.raises(ValueError, match="choices"):
        make_question("Pick one", kind="choice")


def test_load_jsonl_without_answers(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"problem": "1+1?"}\n{"problem": "2+2?"}\n')
    qs = load_jsonl(f, "problem", None, "numeric")
    assert [q.gold for q in qs] == ["", ""] and [q.id for q in qs] == ["1", "2"]
    f.write_text('{"problem": "1+1?"}\n{"text": "2+2?"}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:2.*problem"):
        load_jsonl(f, "problem", None, "numeric")


def test_cli_bad_input(exported, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        main(["--policy", str(exported), "--questions", str(tmp_path / "nope.jsonl"), "--llm", "sim"])
    (tmp_path / "q.jsonl").write_text('{"question": "Pick", "options": ["a", "b"]}\n')
    with pytest.raises(ValueError, match="--choices-field"):
        main(["--policy", str(exported), "--questions", str(tmp_path / "q.jsonl"), "--kind", "choice"])
    with pytest.raises(SystemExit):
        main(["--policy", str(exported), "--question", "x", "--choice", "a"])  # --choice without --kind choice
    assert "--kind choice" in capsys.readouterr().err
    r = subprocess.run([sys.executable, "-m", "dear.infer", "--policy", str(tmp_path), "--question", "1+1?"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not a DEAR export" in r.stderr
    with pytest.raises(ValueError, match=r"--out .*is a directory"):  # checked before any debate runs
        main(["--policy", str(exported), "--question", "1+1?", "--llm", "sim", "--out", str(tmp_path)])


def test_cli_with_agent_profiles_names_them_and_records_them_in_every_turn(exported, tmp_path, capsys):
    out = tmp_path / "traces.jsonl"
    question = load_synthetic(n=1, seed=0, split="test")[0].question
    assert main(["--policy", str(exported), "--llm", "sim", "--question", question, "--agent-profiles",
                 "cot,direct:24,sim:cot", "--out", str(out)]) == 0
    assert "agents sim:cot, sim:direct:24, sim:cot" in capsys.readouterr().out
    trace = json.loads(out.read_text().splitlines()[0])
    assert all([t["profile"] for t in turns] == ["sim:cot", "sim:direct:24", "sim:cot"] for turns in trace["rounds"])
    assert [t["max_tokens"] for t in trace["rounds"][0]] == [512, 24, 512]


def test_cli_on_the_smoke_model_writes_traces_and_decisions(exported, tmp_path, capsys):
    """The real parts: SmolLM2-135M through llama.cpp, one question as text, gold unknown."""
    out = tmp_path / "traces.jsonl"
    rc = main(["--policy", str(exported), "--llm", "smoke", "--question", "What is 12 + 30?", "--kind", "integer",
               "--n-rounds", "1", "--max-tokens", "24", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "SYNTHETIC" in text and "round 1: answers" in text and "agent 0: " in text
    assert "accuracy" not in text  # no gold, nothing graded
    trace = json.loads(out.read_text().splitlines()[0])
    assert len(trace["rounds"]) == 2 and all(t["grader"] == "none" for r in trace["rounds"] for t in r)
    decisions = json.loads((tmp_path / "traces.regulator.jsonl").read_text().splitlines()[0])
    assert decisions["debate_id"] == trace["debate_id"] and len(decisions["decisions"]) == 1
    assert [t["peers"] for t in trace["rounds"][1]] == [
        [j for j, m in enumerate(row) if m] for row in decisions["decisions"][0]["mask"]]


def _turn(agent, rnd, answer, peers=(), silent=False, fresh=False, error=None):
    from dear.debate.trace import AgentTurn

    return AgentTurn(agent=agent, round=rnd, messages=[], text="", reasoning="r", conclusion="c", answer=answer,
                     answer_key=answer, correct=False, grader="none", temperature=0.5 + rnd / 4, top_p=0.95, seed=rnd,
                     peers=list(peers), prompt_tokens=0, completion_tokens=0, finish_reason="stop", latency_s=0.0,
                     silent=silent, fresh=fresh, error=error)


def test_the_text_output_says_what_each_agent_did_with_sampling_only_where_a_call_was_made():
    """Issue 59 item 3: per round and agent the turn kind (a round-0 sample, revise reading whom, keep, a fresh
    sample, not called after a stop), T and top-p only where a model call was made."""
    from dear.debate.trace import DebateTrace
    from dear.infer import describe_rounds, inference_result

    trace = DebateTrace(debate_id="d", question_id="q", task="user", question="?", gold="", kind="numeric",
                        model_ids=["m"] * 3)
    trace.add_round([_turn(0, 0, "391"), _turn(1, 0, "491"), _turn(2, 0, "491")])
    trace.add_round([_turn(0, 1, "391", peers=[1, 2]), _turn(1, 1, "491", silent=True),
                     _turn(2, 1, "301", fresh=True)])
    trace.final_answer = "391"

    class Done:
        question = make_question("?", "integer")
        debate_id = "d"

    Done.trace = trace
    lines = describe_rounds(inference_result(Done, []), n_rounds=2)
    assert lines == [
        "  round 0: answers ['391', '491', '491']",
        "    agent 0: sample, T 0.50, top-p 0.95 -> 391",
        "    agent 1: sample, T 0.50, top-p 0.95 -> 491",
        "    agent 2: sample, T 0.50, top-p 0.95 -> 491",
        "  round 1: answers ['391', '491', '301']",
        "    agent 0: revise reading agents 1, 2, T 0.75, top-p 0.95 -> 391",
        "    agent 1: keep (no call) -> 491",
        "    agent 2: fresh sample, T 0.75, top-p 0.95 -> 301",
        "  round 2: not called (the policy stopped the debate after round 1)",
    ]


def test_the_cli_prints_every_turn_kind_of_a_real_policy_debate(exported, capsys):
    """On the sim with the shipped extended policy: each printed turn agrees with the trace's flags."""
    from dear.export import SHIPPED_POLICY

    question = load_synthetic(n=3, seed=0, split="test")[2].question
    out = exported.parent / "t.jsonl"
    assert main(["--policy", str(SHIPPED_POLICY), "--llm", "sim", "--question", question, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    trace = json.loads(out.read_text().splitlines()[0])
    printed, rnd = {}, None
    for line in text.splitlines():
        if line.startswith("  round "):
            rnd = int(line.split()[1].rstrip(":"))
        elif line.startswith("    agent "):
            printed[rnd, int(line.split()[1].rstrip(":"))] = line
    turns = [t for r in trace["rounds"] for t in r]
    assert set(printed) == {(t["round"], t["agent"]) for t in turns}
    for t in turns:
        line = printed[t["round"], t["agent"]]
        assert ("keep (no call)" in line) == t["silent"] and (" T " in line) != t["silent"], line
        assert ("fresh sample" in line) == t["fresh"], line
    assert any(t["silent"] for t in turns) and any(t["fresh"] for t in turns)  # this question shows both


def test_an_encoder_other_than_the_policys_is_refused_unless_allowed(exported):
    from dear.export import choose_encoder

    assert choose_encoder("hashing") == "hashing" and choose_encoder("hashing", "hashing") == "hashing"
    with pytest.raises(ValueError, match="differs from 'hashing'.*--allow-encoder-mismatch"):
        choose_encoder("hashing", "hashing:64")
    assert choose_encoder("hashing", "hashing:64", allow_mismatch=True) == "hashing:64"
    with pytest.raises(ValueError, match="allow-encoder-mismatch"):
        RegulatedDebater(exported, SimBackend(), encoder="hashing:64")
    debater = RegulatedDebater(exported, SimBackend(), encoder="hashing:64", allow_encoder_mismatch=True)
    assert debater.encoder_spec == "hashing:64"
    with pytest.raises(ValueError, match="allow-encoder-mismatch"):  # the CLI prints it as one `error:` line
        main(["--policy", str(exported), "--llm", "sim", "--question", "1+1?", "--encoder", "hashing:64"])


def test_the_shipped_policy_is_the_default_and_loads():
    """The default is the extended action set (fresh samples, keep, a stop, the vote over every sample); the
    paper's action set ships beside it."""
    from dear.export import PAPER_POLICY, SHIPPED_POLICY, load_exported
    from dear.infer import parse_args

    a = parse_args(["--question", "1+1?"])
    assert a.policy == str(SHIPPED_POLICY)
    exported = load_exported(a.policy)  # manifest, weights hash and layout checked
    assert exported.n_agents == 3 and exported.manifest["training"]["synthetic"] is True
    assert exported.policy.config.actions == "extended" and exported.decision == "all-answers"
    paper = load_exported(PAPER_POLICY)
    assert paper.policy.config.actions == "paper" and paper.decision == "last-round"


def test_a_policy_path_that_does_not_exist_is_named_as_missing(tmp_path):
    from dear.export import ExportError

    with pytest.raises(ExportError, match=r"^--policy: .*nope: does not exist"):
        main(["--policy", str(tmp_path / "nope"), "--question", "1+1?", "--llm", "sim"])
    (tmp_path / "empty").mkdir()  # a directory that exists but holds no export: the old message
    with pytest.raises(ExportError, match="not a DEAR export"):
        main(["--policy", str(tmp_path / "empty"), "--question", "1+1?", "--llm", "sim"])


def test_a_training_run_given_as_policy_gets_the_export_command(tmp_path):
    from dear.export import ExportError, load_exported

    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ExportError, match="python -m dear.export"):
        load_exported(tmp_path)


@pytest.mark.slow
def test_the_cli_runs_without_a_policy_on_the_smoke_model(capsys):
    """No --policy: the shipped policy regulates a real (smoke-model) debate."""
    rc = main(["--llm", "smoke", "--question", "What is 12 + 30?", "--kind", "integer", "--n-rounds", "1",
               "--max-tokens", "16"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "round 1: answers" in text


def test_the_transfer_warning_names_only_a_real_backend(exported, caplog):
    """A sim-trained policy on the sim itself is no sim-to-real transfer; on a real backend it is said once."""
    class RealStandIn(SimBackend):
        synthetic = False

    with caplog.at_level("WARNING", logger="dear.infer"):
        with RegulatedDebater(exported, SimBackend(seed=0)) as debater:
            assert not debater.transfer
        assert "sim-to-real" not in caplog.text
        with RegulatedDebater(exported, RealStandIn(seed=0)) as debater:
            assert debater.transfer
    assert caplog.text.count("sim-to-real transfer") == 1
