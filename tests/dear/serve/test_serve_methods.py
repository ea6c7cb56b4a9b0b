"""The methods served by `model` and the budgets per request, on real `python -m dear.serve` processes on
127.0.0.1 spoken to with the official `openai` client (helpers from tests/dear/serve/test_serve.py).

- `model` picks the method: `dear` (the policy), `cot`, `sc`, `majority`, `mad`, `mad-stop`; `/v1/models` lists
  them; an unknown model is 404 `model_not_found` naming the served ones;
- `max_tokens` / `max_completion_tokens` is the debate's completion-token budget, `dear_max_rounds` its cap on
  exchange rounds: a debate a budget stops votes over what it has, ends with `finish_reason: "length"` and
  says which budget in `dear.stopped`;
- one backend call per scheduler step whatever the mix of methods (`SharedBatch`).

The served policy is the shipped one (the server's default `--policy`), on the synthetic debaters (`sim`)
and, marked slow, on the smoke GGUF model through llama.cpp.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from dear.export import PAPER_POLICY  # noqa: E402
from tests.dear.serve.test_serve import ask, client, dear_server, synthetic_questions  # noqa: E402

# the catalog's order (dear/debate/methods.py): the baselines, then every sampling rule
METHODS = ["dear", "cot", "sc", "majority", "adaptive-sc-2", "adaptive-sc-3", "adaptive-sc-2-from-1",
           "adaptive-sc-2-from-2", "adaptive-sc-3-from-1", "adaptive-sc-3-from-2", "esc-2", "esc-3", "cisc-3",
           "confident-stop", "mad", "mad-stop"]
PER_TURN = 512  # the server's default --max-tokens
ROUND_WORST = 3 * PER_TURN  # V = 3 agents at the per-turn limit


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory):
    with dear_server(PAPER_POLICY, "sim", tmp_path_factory.mktemp("methods"), "--batch-window-ms", "200",
                     "--max-active", "64") as base:
        yield base


def extension(r) -> dict:
    return r.model_extra["dear"]


def completion_per_round(dear: dict) -> list[int]:
    return [sum(a["completion_tokens"] for a in rnd["agents"]) for rnd in dear["rounds"]]


def check_token_budget_rule(dear: dict, budget: int, round_worst: int) -> None:
    """A debate the token budget stopped: each exchange round ran because the tokens spent before it plus its
    worst case fit the budget, and the next one would not have."""
    spent = completion_per_round(dear)
    assert dear["stopped"] == "token_budget" and sum(spent) <= budget, (spent, budget)
    assert all(sum(spent[:k]) + round_worst <= budget for k in range(1, len(spent))), (spent, budget)
    assert sum(spent) + round_worst > budget, (spent, budget)



# ---------------------------------------------------------------------------------------------------
# Methods


def test_models_lists_every_method_and_each_one_answers(sim_server):
    c = client(sim_server)
    ids = [m.id for m in c.models.list()]
    assert [i for i in ids if ":" not in i] == METHODS
    assert {f"{m}:integer" for m in METHODS} <= set(ids)
    assert httpx.get(f"{sim_server}/health").json()["models"] == METHODS
    q = synthetic_questions(1, seed=4)[0]
    got = {m: ask(c, q, model=m, seed=2) for m in METHODS}
    for name, r in got.items():
        dear = extension(r)
        assert r.model == name and dear["method"] == name and r.choices[0].finish_reason == "stop", name
        assert dear["stopped"] is None and r.choices[0].message.content == (dear["answer"] or "")
        assert r.usage.completion_tokens == sum(completion_per_round(dear)) > 0
    shape = {m: (extension(r)["n_agents"], len(extension(r)["rounds"])) for m, r in got.items()}
    assert shape["dear"] == shape["mad"] == shape["sc"] == (3, 3)
    assert shape["cot"] == (1, 1) and shape["majority"] == (3, 1)
    # Only DEAR's rounds carry the regulator's decisions; MAD's agents read every peer.
    assert all("regulator" in rnd for rnd in extension(got["dear"])["rounds"][1:])
    assert all(a["peers"] == [j for j in range(3) if j != a["agent"]]
               for rnd in extension(got["mad"])["rounds"][1:] for a in rnd["agents"])
    # Self-consistency: 3 samples per round, 9 in all, and every one of them votes.
    assert sum(extension(got["sc"])["votes"].values()) == 9
    # MAD-stop ends after the first unanimous round (or runs all rounds).
    stop = extension(got["mad-stop"])
    keys = [[a["key"] for a in rnd["agents"]] for rnd in stop["rounds"]]
    first_unanimous = next((k for k, ks in enumerate(keys) if ks[0] is not None and len(set(ks)) == 1), 2)
    assert len(keys) == first_unanimous + 1
    # A sampling rule draws one sample a round after its first: adaptive SC from 1 holds its samples in later rounds
    adaptive = extension(got["adaptive-sc-2-from-1"])
    assert len(adaptive["rounds"][0]["agents"]) == 3 and sum(adaptive["votes"].values()) >= 2
    # The answer kind still comes from the suffix, on every method.
    assert extension(ask(c, q, model="cot:integer"))["kind"] == "integer"


def test_an_unknown_model_is_404_naming_the_served_ones(sim_server):
    with pytest.raises(openai.NotFoundError) as err:
        ask(client(sim_server), synthetic_questions(1)[0], model="gpt-4o")
    body = err.value.body
    assert err.value.status_code == 404 and body["code"] == "model_not_found" and body["param"] == "model"
    assert all(m in body["message"] for m in METHODS), body


def test_concurrent_requests_of_every_method_share_one_backend_call_per_step(sim_server):
    before = httpx.get(f"{sim_server}/health").json()["scheduler"]
    questions = synthetic_questions(4, seed=9)
    jobs = [(m, q) for m in METHODS for q in questions]
    start = threading.Barrier(len(jobs))
    errors: list[str] = []
    methods_answered: list[str] = []

    def one(method: str, question: str) -> None:
        start.wait()
        try:
            methods_answered.append(extension(ask(client(sim_server), question, model=method))["method"])
        except Exception as e:  # collected, so one failure does not hide the others
            errors.append(f"{method}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(methods_answered) == sorted(m for m, _ in jobs)
    after = httpx.get(f"{sim_server}/health").json()["scheduler"]
    steps, calls = after["steps"] - before["steps"], after["backend_calls"] - before["backend_calls"]
    # The one-agent CoT engine stepped together with the three-agent ones, in the same backend call.
    assert after["max_engines_per_step"] >= 2 and 0 < calls <= steps, (before, after)


def test_shared_batch_answers_engines_stepping_together_in_one_backend_call():
    """In-process: the threads of one `run_together` get their completions from one call of the wrapped
    backend; a step that makes no call or raises does not hold the others up."""
    from dear.llm.base import Backend, ChatMessage, ChatRequest, Completion
    from dear.serve.batching import SharedBatch

    class Echo(Backend):
        def __init__(self):
            self.calls: list[int] = []

        def generate(self, requests):
            self.calls.append(len(requests))
            if any(r.messages[0].content == "fail" for r in requests):
                raise ConnectionError("backend down")
            return [Completion(r.messages[0].content, 1, 1, "stop", 0.0) for r in requests]

    inner = Echo()
    batch = SharedBatch(inner)
    got: dict[str, list[str]] = {}

    def engine(name: str, n: int, texts=None):
        def step() -> None:
            requests = [ChatRequest((ChatMessage("user", t),)) for t in (texts or [f"{name}{k}" for k in range(n)])]
            got[name] = [c.text for c in batch.generate(requests)]
        return step

    def idle() -> None:  # an engine whose debates all stopped: no call
        got["idle"] = []

    def bug() -> None:
        raise RuntimeError("engine bug")

    batch.run_together([engine("a", 3), engine("b", 1), idle, engine("c", 2)])
    assert inner.calls == [6] and got == {"a": ["a0", "a1", "a2"], "b": ["b0"], "idle": [], "c": ["c0", "c1"]}
    with pytest.raises(RuntimeError, match="engine bug"):
        batch.run_together([engine("d", 2), bug])
    assert inner.calls[-1] == 2 and got["d"] == ["d0", "d1"]
    with pytest.raises(ConnectionError, match="backend down"):  # every caller hears the backend's error
        batch.run_together([engine("e", 1), engine("f", 0, ["fail"])])
    assert inner.calls[-1] == 2
    assert [c.text for c in batch.generate([ChatRequest((ChatMessage("user", "alone"),))])] == ["alone"]
    assert batch.calls == len(inner.calls) == 4
    batch.close()


# ---------------------------------------------------------------------------------------------------
# Budgets


def test_a_token_budget_stops_the_debate_after_the_last_round_that_fits(sim_server):
    c = client(sim_server)
    q = synthetic_questions(1, seed=5)[0]
    # Round 0's worst case exactly: round 0 runs, and no exchange round can fit any more.
    r = ask(c, q, model="dear", seed=1, max_tokens=ROUND_WORST)
    dear = extension(r)
    assert r.choices[0].finish_reason == "length" and dear["stopped"] == "token_budget"
    assert len(dear["rounds"]) == 1 and dear["n_rounds"] == 0 and r.usage.completion_tokens <= ROUND_WORST
    assert dear["budget"] == {"max_tokens": ROUND_WORST, "max_rounds": None}
    assert r.choices[0].message.content == (dear["answer"] or "") and sum(dear["votes"].values()) == 3
    # Room for one exchange round on top of round 0's spend (the sim's answers: ~110-135 tokens), not for two.
    budget = ROUND_WORST + 600
    for field in ("max_tokens", "max_completion_tokens"):
        r = ask(c, q, model="mad", seed=1, **{field: budget})
        dear = extension(r)
        assert r.choices[0].finish_reason == "length" and len(dear["rounds"]) == 2, field
        assert r.usage.completion_tokens <= budget
        check_token_budget_rule(dear, budget, ROUND_WORST)
    # A budget that every round fits: the debate runs all its rounds, as without one.
    r = ask(c, q, model="mad", seed=1, max_tokens=10 * ROUND_WORST)
    assert extension(r)["stopped"] is None and r.choices[0].finish_reason == "stop"
    assert len(extension(r)["rounds"]) == 3


def test_a_round_budget_stops_the_debate_and_says_so(sim_server):
    c = client(sim_server)
    q = synthetic_questions(1, seed=6)[0]
    for method, cap, rounds, stopped in (("dear", 1, 2, "round_budget"), ("dear", 0, 1, "round_budget"),
                                         ("dear", 5, 3, None), ("sc", 1, 2, "round_budget")):
        r = ask(c, q, model=method, seed=3, extra_body={"dear_max_rounds": cap})
        dear = extension(r)
        assert len(dear["rounds"]) == rounds and dear["stopped"] == stopped, (method, cap, dear["stopped"])
        assert r.choices[0].finish_reason == ("stop" if stopped is None else "length")
        assert dear["budget"]["max_rounds"] == cap
    assert sum(dear["votes"].values()) == 6  # sc capped at one exchange round: 3 + 3 samples


def test_a_streamed_debate_stopped_by_a_budget_ends_with_length(sim_server):
    chunks = list(ask(client(sim_server), synthetic_questions(2, seed=7)[1], model="dear", seed=4, stream=True,
                      extra_body={"dear_max_rounds": 1}))
    rounds = [ch.model_extra["dear"]["round"]["round"] for ch in chunks
              if "round" in (ch.model_extra.get("dear") or {})]
    final = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert rounds == [0, 1] and len(final) == 1
    assert final[0].choices[0].finish_reason == "length" and final[0].model_extra["dear"]["stopped"] == "round_budget"


def test_budgets_that_cannot_be_kept_are_400_naming_the_field(sim_server):
    url = f"{sim_server}/v1/chat/completions"
    user = [{"role": "user", "content": synthetic_questions(1)[0]}]
    cases = [
        ({"model": "dear", "max_tokens": 100}, "max_tokens", "budget_too_small", f"at least {ROUND_WORST}"),
        ({"model": "sc", "max_completion_tokens": ROUND_WORST - 1}, "max_completion_tokens", "budget_too_small",
         f"at least {ROUND_WORST}"),
        ({"model": "dear", "max_tokens": 0}, "max_tokens", None, "greater than or equal to 1"),
        ({"model": "dear", "max_tokens": 2000, "max_completion_tokens": 3000}, "max_completion_tokens", None,
         "disagree"),
        ({"model": "dear", "dear_max_rounds": -1}, "dear_max_rounds", None, "greater than or equal to 0"),
        ({"model": "dear", "dear_max_rounds": "two"}, "dear_max_rounds", None, "valid integer"),
    ]
    for body, param, code, needle in cases:
        r = httpx.post(url, json=body | {"messages": user})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == param and error["code"] == code, (body, r.text)
        assert needle in error["message"], (body, error)
    # One agent's worst case is CoT's whole round 0: a budget other methods refuse is enough for it.
    r = httpx.post(url, json={"model": "cot", "max_tokens": PER_TURN, "messages": user})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= PER_TURN
    with pytest.raises(openai.BadRequestError, match="budget of 100"):
        ask(client(sim_server), user[0]["content"], max_tokens=100)


# ---------------------------------------------------------------------------------------------------
# The real model


@pytest.mark.slow
def test_methods_and_a_token_budget_on_the_smoke_model(tmp_path):
    """SmolLM2-135M through llama.cpp: every method answers, and a token budget stops a debate on the model's
    real token counts (its answers are nonsense; the plumbing is what is checked)."""
    t0 = time.perf_counter()
    with dear_server(PAPER_POLICY, "smoke", tmp_path, "--n-rounds", "2", "--max-tokens", "24", "--kind",
                     "integer", "--max-active", "2") as base:
        c = client(base)
        answered = {m: ask(c, "What is 12 + 30?", model=m, seed=3) for m in METHODS}
        budget = 3 * 24 + 40  # round 0's worst case plus less than one more round's
        r = ask(c, "What is 12 + 30?", model="mad", seed=3, max_tokens=budget)
        health = httpx.get(f"{base}/health").json()
    for name, a in answered.items():
        assert extension(a)["method"] == name and extension(a)["backend"].startswith("smoke:")
    dear = extension(r)
    assert r.choices[0].finish_reason == "length" and len(dear["rounds"]) < 3
    check_token_budget_rule(dear, budget, 3 * 24)
    assert health["scheduler"]["backend_calls"] <= health["scheduler"]["steps"]
    print(f"\nsmoke: 6 methods and one budgeted debate in {time.perf_counter() - t0:.1f} s; budget {budget}, "
          f"spent {r.usage.completion_tokens} completion tokens in {len(dear['rounds'])} round(s)")


def test_the_served_policy_votes_by_the_rule_it_was_trained_with_and_the_baselines_by_theirs():
    """A bank-world policy trained with the all-answers vote votes so when served; MAD keeps the paper's last
    round and a confidence rule its weighted vote (each protocol's own rule, else its engine's)."""
    from dear.infer import RegulatedDebater
    from dear.serve.methods import build_methods
    from tests.dear.debate.test_debate_engine import FakeBackend

    backend = FakeBackend()
    with RegulatedDebater("results/policy-bank-gsm8k-p0.05", backend, encoder="hashing",
                          allow_encoder_mismatch=True) as debater:
        methods = build_methods(debater, backend)
    assert debater.config.decision == "all-answers"
    assert methods["dear"].decision == "all-answers"
    assert methods["mad"].decision == methods["cot"].decision == "last-round"
    assert methods["cisc-3"].decision == "confidence-weighted"
