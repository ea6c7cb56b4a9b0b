"""eval.run with an extended-action policy (sim backend): the debates play the turn kinds and stops the policy
chooses, vote by the checkpoint's decision rule, and are the debates dear.infer runs with the same export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dear import tasks
from dear.debate.trace import read_jsonl
from dear.export import export_policy
from dear.policy import KINDS, JointPolicy, PolicyConfig, n_pairs
from dear.vote import tally
from eval import run as eval_run

N = 10


def extended_export(root: Path, decision: str = "all-answers") -> Path:
    """An extended policy with a fixed play: agent 0 revises reading everyone, agent 1 keeps, agent 2 draws a fresh
    sample, and the debate stops once the vote's leader holds V answers (stop_mode agree: a feature of the final
    vote, so the stop depends on the decision rule)."""
    torch.manual_seed(0)
    pol = JointPolicy(PolicyConfig(n_agents=3, actions="extended", stop_mode="agree", stop_agree=1.0,
                                   behavior_map="clip"))
    head = pol.selection.net[-1]
    k = n_pairs(3)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[:k] = 5.0  # every pair read
        for agent, kind in enumerate(("revise", "keep", "fresh")):
            head.bias[k + 3 * agent + KINDS.index(kind)] = 5.0
    return export_policy(pol, root, encoder="hashing",
                         training={"llm": "sim", "task": "synthetic", "synthetic": True, "n_rounds": 2,
                                   "silent": True, "decision": decision})


def _eval(out: Path, policy: Path) -> None:
    eval_run.main(["--checkpoint", str(policy), "--methods", "dear", "--llm", "sim", "--benchmarks", "synthetic",
                   "--n", str(N), "--seed", "0", "--out", str(out), "--batch", "4", "--n-boot", "100",
                   "--max-tokens", "512", "--no-progress"])


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = tmp_path_factory.mktemp("extended")
    policy = extended_export(root / "policy")
    _eval(root / "res", policy)
    traces = read_jsonl(root / "res" / "traces" / "synthetic" / "dear.jsonl")
    records = [json.loads(x) for x in (root / "res" / "traces" / "synthetic" / "dear.regulator.jsonl")
               .read_text().splitlines()]
    return policy, root / "res", traces, records


def test_the_debates_play_the_policys_kinds_and_stops(evaluated):
    _, _, traces, records = evaluated
    assert len(traces) == len(records) == N
    stopped = ran = 0
    for t, rec in zip(traces, records):
        assert rec["question_id"] == t.question_id
        for d in rec["decisions"]:
            r = d["round"]
            if d["stop"]:  # nothing ran from this round on
                assert len(t.rounds) == r
                stopped += 1
                continue
            ran += 1
            assert d["kinds"] == ["revise", "keep", "fresh"]
            kinds = ["fresh" if x.fresh else "keep" if x.silent else "revise" for x in t.rounds[r]]
            assert kinds == d["kinds"]
            assert t.rounds[r][1].prompt_tokens == 0 and t.rounds[r][2].peers == []
    assert stopped and ran  # both parts of the play happen on these questions


def test_the_final_vote_is_the_checkpoints_decision_rule(evaluated):
    _, out, traces, _ = evaluated
    longer = 0
    for t in traces:
        voters = list(t.rounds[0]) + [x for turns in t.rounds[1:] for x in turns if not x.silent]
        keys = [x.answer_key for x in voters]
        assert t.vote_counts == tally(keys).counts
        longer += sum(t.vote_counts.values()) > sum(k is not None for k in t.answer_keys()[-1])
    assert longer  # the vote counted more answers than the last round holds: all-answers, not last-round
    assert "final vote is `all-answers`" in (out / "summary.md").read_text()
    # the rule is recorded: in every trace and, per method, in run.json (eval.regrade never guesses it)
    assert {t.decision for t in traces} == {"all-answers"}
    assert json.loads((out / "run.json").read_text())["vote_rules"] == {"dear": "all-answers"}
    assert "extended action set" in (out / "summary.md").read_text()


def test_the_eval_debates_are_dear_infers(evaluated):
    from dear.infer import RegulatedDebater

    policy, _, traces, records = evaluated
    questions = tasks.load("synthetic", n=N, seed=0)
    with RegulatedDebater(policy, "sim", max_tokens=512, seed=0) as debater:
        results = debater.run(questions)
    by_id = {t.question_id: (t, rec) for t, rec in zip(traces, records)}
    for r in results:
        t, rec = by_id[r.question_id]
        assert [[x.text for x in turns] for turns in r.trace.rounds] == [[x.text for x in turns] for turns in t.rounds]
        assert [(c.kinds, c.stop) for c in r.controls] == [(d["kinds"], d["stop"]) for d in rec["decisions"]]
        assert r.trace.vote_counts == t.vote_counts and r.trace.final_score == t.final_score


def test_the_random_control_plays_dears_action_frequencies(evaluated, tmp_path):
    import shutil

    from eval.action_frequencies import action_frequencies, turn_kind

    policy, out, traces, _ = evaluated
    res = tmp_path / "res"
    shutil.copytree(out, res)  # the fixture's directory stays as the other tests read it
    eval_run.main(["--checkpoint", str(policy), "--methods", "dear,dear-random-mask", "--llm", "sim",
                   "--benchmarks", "synthetic", "--n", str(N), "--seed", "0", "--out", str(res), "--batch", "4",
                   "--n-boot", "100", "--max-tokens", "512", "--no-progress"])
    freq = json.loads((res / "run.json").read_text())["random_policy_frequencies"]["synthetic"]
    assert json.loads((res / "run.json").read_text())["vote_rules"] == {"dear": "all-answers",
                                                                         "dear-random-mask": "all-answers"}
    assert freq == json.loads(json.dumps(action_frequencies(traces, 2).to_json()))
    # DEAR's play (agent 0 revises reading both peers, 1 keeps, 2 draws fresh) in every round it went on
    went_on = [t for t in traces if len(t.rounds) > 1]
    assert freq["kinds"][0] == pytest.approx([1 / 3] * 3) and freq["density"][0] == 1.0
    assert freq["stop"][0] == pytest.approx(1 - len(went_on) / N)
    control = read_jsonl(res / "traces" / "synthetic" / "dear-random-mask.jsonl")
    assert len(control) == N
    turns = [a for t in control for turns in t.rounds[1:] for a in turns]
    assert turns and {turn_kind(a) for a in turns} != {0} and any(turn_kind(a) != a.agent for a in turns)
    assert all(len(a.peers) == 2 for a in turns if turn_kind(a) == 0)  # a reviser reads at DEAR's density 1
    assert all(a.peers == [] for a in turns if turn_kind(a) != 0)
    md = (res / "summary.md").read_text()
    assert "| DEAR extended random (action frequencies) (sim-trained) |" in md
    assert "| DEAR extended (sim-trained) |" in md


def test_a_belief_weighted_policy_votes_so_in_eval_and_in_dear_infer(tmp_path):
    """A policy trained with the belief-weighted vote brings it to every harness: eval.run and dear.infer weigh
    each answer by its agent's certainty from the policy's own encoder, and decide alike."""
    from dear.infer import RegulatedDebater

    policy = extended_export(tmp_path / "policy", decision="belief-weighted")
    _eval(tmp_path / "res", policy)
    assert "final vote is `belief-weighted`" in (tmp_path / "res" / "summary.md").read_text()
    traces = {t.question_id: t for t in read_jsonl(tmp_path / "res" / "traces" / "synthetic" / "dear.jsonl")}
    with RegulatedDebater(policy, "sim", max_tokens=512, seed=0) as debater:
        results = debater.run(tasks.load("synthetic", n=N, seed=0))
        assert debater.engine.weigher is not None
    for r in results:
        assert r.trace.final_answer == traces[r.question_id].final_answer
        assert r.trace.final_score == traces[r.question_id].final_score

