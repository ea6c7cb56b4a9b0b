"""The learning check in the bank world: its rule grid, the held-out part of the train split, and a small check run
end to end on the committed bank of the embedded model (real replayed samples)."""

from __future__ import annotations

import json

import pytest

from dear import tasks
from train.bank_check import Rule, max_samples, named_rules, rule_grid, run_price

NAMED = named_rules(3, 2)


def test_the_train_split_has_a_fixed_held_out_quarter():
    fit, holdout = tasks.load("gsm8k", "train/fit"), tasks.load("gsm8k", "train/holdout")
    ids = {q.id for q in tasks.load("gsm8k", "train")}
    assert {q.id for q in fit} | {q.id for q in holdout} == ids and not {q.id for q in fit} & {q.id for q in holdout}
    assert 0.2 < len(holdout) / len(ids) < 0.3
    assert [q.id for q in tasks.load("gsm8k", "train/holdout", n=5, seed=1)] == \
        [q.id for q in tasks.load("gsm8k", "train/holdout", n=5, seed=1)]
    assert all(tasks.held_out(q.id) for q in tasks.load("gsm8k", "train/holdout", n=20, seed=3))
    with pytest.raises(ValueError, match="part after '/'"):
        tasks.load("gsm8k", "train/dev")


def test_the_grid_holds_every_named_rule_once():
    grid = rule_grid(3, 2, 8)
    assert len(grid) == len(set(grid)) == 3 * 4 + 2 * 3  # start 3 with every agent fresh needs 9 samples
    assert set(NAMED) <= set(grid) and all(max_samples(r, 3, 2) <= 8 for r in grid)
    assert Rule(1, "fresh-one", 1).label == "start 1, fresh-one, stop at once"
    # a long world with a sample budget: every rule fits the bank, self-consistency draws the budget
    long = rule_grid(3, 7, 8, budget=8)
    assert len(long) == 3 * 4 + 3 * 3 and set(named_rules(3, 7, 8)) <= set(long)
    assert named_rules(3, 7, 8)[Rule(1, "fresh", None)] == "SC-8" and NAMED[Rule(1, "fresh", None)] == "SC-7"
    # one sample a round: every agent asking means the seats take turns, one sample each round
    turns = named_rules(3, 7, 8, per_round=1)
    assert turns[Rule(2, "fresh", 2)] == "adaptive SC from 2, seats in turn" and set(turns) <= set(rule_grid(3, 7, 8, 8, 1))
    assert max_samples(Rule(1, "fresh", None), 3, 2, per_round=1) == 3 and max_samples(Rule(1, "fresh", None), 3, 2) == 7


def test_a_small_check_runs_on_the_committed_bank(tmp_path):
    overrides = ["env.encoder=hashing", "run.iterations=1", "rollout.envs_per_worker=8",
                 "rollout.episodes_per_iter=8"]
    rows = run_price("gsm8k", overrides, 0.05, [1], tmp_path, episodes=8, eval_seed=3, select_episodes=4)
    kinds = sorted(r["kind"] for r in rows)
    assert kinds == ["best-fixed", "dear", *["rule"] * (len(NAMED) + 2)]  # + CISC-3 and confident stop, replayed
    stop = next(r for r in rows if r["name"] == "confident stop")
    assert "fitted on train/fit" in stop["detail"] and len(stop["scores"]) == 8
    assert stop["questions"] == next(r for r in rows if r["name"] == "single CoT")["questions"]
    single = next(r for r in rows if r["name"] == "single CoT")
    sc7 = next(r for r in rows if r["name"] == "SC-7")
    assert single["tokens_per_question"] < sc7["tokens_per_question"]  # one sample against seven
    assert all(len(r["objectives"]) == 8 for r in rows)
    table = (tmp_path / "table.md").read_text()
    assert "best fixed rule" in table and "synthetic" not in table.lower()
    assert json.loads((tmp_path / "settings.json").read_text())["token_cost"] == 0.05


def test_differences_are_clustered_by_question():
    from train.bank_check import by_question_difference

    # two questions: one where the row wins by 1 on each of its 9 debates, one where it loses by 1 once
    a = [1.0] * 9 + [0.0]
    b = [0.0] * 9 + [1.0]
    mean, low, high = by_question_difference(a, b, ["q1"] * 9 + ["q2"])
    assert mean == 0.0 and low <= -0.9 and high >= 0.9  # two questions, not ten debates: nothing is settled
    assert by_question_difference([1.0], [0.0], ["q1"])[0] != by_question_difference([1.0], [0.0], ["q1"])[0]  # nan


def test_a_replayed_rule_reads_one_seeded_order_per_debate():
    from dear.debate.replay_orders import orders
    from dear.debate.sampling_rules import RuleParams, Samples
    from train.bank_check import replay_row

    s = Samples(("a", "b", "a", "c"), (True, False, True, False), (10, 20, 30, 40), (-0.1, -0.5, -0.2, -0.9))
    row = replay_row("first", "cot", RuleParams(), {"q": s}, ["q", "q", "q"], 0.05, n_orders=2, seed=7)
    firsts = [o[0] for o in orders(4, 2, 7, "q")]
    want = [float(s.correct[firsts[k % 2]]) for k in range(3)]  # the third debate reads the first order again
    assert row.scores == want and row.episodes == 3
    assert row.tokens_per_question == pytest.approx(sum(s.tokens[firsts[k % 2]] for k in range(3)) / 3)
    assert row.objectives[0] == pytest.approx(want[0] - 0.05 * s.tokens[firsts[0]] / 1000)


def test_a_mixed_pool_gets_the_fixed_mixing_rules_replayed_on_the_worlds_questions(tmp_path, monkeypatch):
    """In a pool of cot and pot agents, each mode alone and every schedule of both are replayed (adaptive SC from 2)
    on the questions of the world's debates: here cot always answers a (right) and pot always b (wrong)."""
    import train.bank_check as bank_check
    from dear.debate.mode_mixing import SCHEDULES
    from dear.debate.sampling_rules import Samples
    from train.config import load_config
    from train.learning_check import CheckDir, Row, read_rows

    shelves = {"cot": {"q1": Samples(("a",) * 4, (True,) * 4, (10,) * 4, None)},
               "pot": {"q1": Samples(("b",) * 4, (False,) * 4, (5,) * 4, None)}}
    monkeypatch.setattr(bank_check, "shelf_samples", lambda cfg, split, style=None: shelves[style])
    base = load_config("gsm8k-modes", ["env.encoder=hashing"])  # the pool cot, pot, cot
    run = CheckDir(tmp_path, {"overrides": []})
    run.add("world-row", Row("a world row", "rule", 1.0, 10.0, 0, 0, 0, 0, 2), questions=["q1", "q1"])
    bank_check.mixing_rows(base, 0.05, "train/holdout", run, run.rows(), seed=0)
    rows = run.rows()
    assert set(rows) == {"world-row", "replay-mix-cot", "replay-mix-pot", *(f"replay-mix-{s}" for s in SCHEDULES)}
    want = {"cot": (1.0, 20), "pot": (0.0, 10), "alternate": (1.0, 25), "alternate-second-first": (0.0, 20),
            "first-then-second": (0.0, 20), "second-then-first": (1.0, 25), "seats-first-second-first": (1.0, 25),
            "seats-second-first-second": (0.0, 20)}  # e.g. a, b, a: right after 3; b, a, b: wrong
    for key, (score, tokens) in want.items():
        row = rows[f"replay-mix-{key}"]
        assert row["scores"] == [score, score] and row["tokens_per_question"] == tokens, key
        assert row["questions"] == ["q1", "q1"] and row["objectives"][0] == pytest.approx(score - 0.05 * tokens / 1000)
    assert rows["replay-mix-alternate"]["name"] == "cot, pot, cot, pot, ...: adaptive SC from 2"
    bank_check.mixing_rows(base, 0.05, "train/holdout", run, run.rows(), seed=0)  # done rows are not added again
    assert len(read_rows(tmp_path)) == len(rows)
