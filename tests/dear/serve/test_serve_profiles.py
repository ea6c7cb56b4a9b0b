"""`python -m dear.serve --agent-profiles`: every method runs on the pool (each agent its backend, reply style and
token limit), the responses and /health name the profiles, the budget and context checks take each agent's limit,
style and backend, a profile's own backend runs beside the shared batch, and bad profiles stop the server at
start-up naming the flag.

In process (Starlette's TestClient, the scheduler itself) on the synthetic debaters (`sim`) with an untrained
exported policy; marked slow, a real server process with two profiles on the smoke model (SmolLM2 GGUF through
llama.cpp), like tests/dear/debate/test_agent_profiles_smoke.py.
"""

from __future__ import annotations

import json
import queue
from pathlib import Path

import pytest

pytest.importorskip("starlette")

from dear.debate import prompts  # noqa: E402
from dear.debate.profiles import parse_profiles  # noqa: E402
from dear.infer import RegulatedDebater, make_question  # noqa: E402
from dear.serve.scheduler import (  # noqa: E402
    BudgetTooSmall,
    ContextTooLong,
    DebateDone,
    DebateFailed,
    DebateJob,
    DebateScheduler,
    _count,
)
from dear.sim import SimBackend  # noqa: E402
from dear.tasks.synthetic import load_synthetic  # noqa: E402

POOL = "cot,direct:24,cot"
NAMES = ["sim:cot", "sim:direct:24", "sim:cot"]  # POOL on --llm sim


class Recording(SimBackend):
    """The synthetic debaters, keeping every request they are sent."""

    def __init__(self):
        super().__init__()
        self.requests: list = []

    def generate(self, requests):
        self.requests += requests
        return super().generate(requests)


def export_random_policy(out: Path, n_agents: int) -> Path:
    """An untrained policy of `n_agents` agents on the hashing encoder (loads at once), exported as if trained on
    `sim`."""
    import torch

    from dear.export import export_policy
    from dear.policy import JointPolicy, PolicyConfig

    torch.manual_seed(0)
    return export_policy(JointPolicy(PolicyConfig(n_agents=n_agents)), out, encoder="hashing",
                         training={"n_rounds": 2, "synthetic": True, "llm": "sim"})


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return export_random_policy(tmp_path_factory.mktemp("profiles") / "policy", 3)


def scheduler_of(policy: Path, llm, profiles: str | None, **kw) -> DebateScheduler:
    pool = parse_profiles(profiles) if profiles else None
    scheduler = DebateScheduler(lambda: RegulatedDebater(policy, llm, agent_profiles=pool), **kw)
    assert scheduler.connect()
    return scheduler


def http_of(scheduler: DebateScheduler):
    from starlette.testclient import TestClient

    from dear.serve.app import create_app

    return TestClient(create_app(scheduler))


def question() -> str:
    return load_synthetic(n=1, seed=0, split="test")[0].question


def chat(http, model: str, **extra):
    return http.post("/v1/chat/completions",
                     json={"model": model, "messages": [{"role": "user", "content": question()}], **extra})


def wait_done(events: queue.Queue, n: int) -> list[DebateDone]:
    """The first `n` debates' ends among the scheduler's events (a debate that could not run fails the test)."""
    done = []
    while len(done) < n:
        event = events.get(timeout=120)
        assert not isinstance(event, DebateFailed), event
        if isinstance(event, DebateDone):
            done.append(event)
    return done


# ---------------------------------------------------------------------------------------------------
# The responses


def test_every_method_runs_on_the_pool_and_the_responses_name_it(policy):
    with http_of(scheduler_of(policy, "sim", POOL, batch_window_s=0.0)) as http:
        for model, names in (("dear", NAMES), ("mad", NAMES), ("sc", NAMES), ("cot", NAMES[:1])):
            r = chat(http, model)
            assert r.status_code == 200, r.text
            dear = r.json()["dear"]
            assert dear["agent_profiles"] == names, model
            assert dear["rounds"] and all([a["profile"] for a in rnd["agents"]] == names for rnd in dear["rounds"])
            assert all([a["style"] for a in rnd["agents"]] == [n.split(":")[1] for n in names]
                       for rnd in dear["rounds"])
        assert http.get("/health").json()["backend"]["agent_profiles"] == NAMES
        r = chat(http, "dear", stream=True)
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        parts = [e["dear"] for e in events if "dear" in e]
        rounds = [p["round"] for p in parts if "round" in p]
        assert len(rounds) == 3 and all([a["profile"] for a in rnd["agents"]] == NAMES for rnd in rounds)
        assert parts[-1]["agent_profiles"] == NAMES


def test_without_profiles_the_responses_are_as_before(policy):
    with http_of(scheduler_of(policy, "sim", None, batch_window_s=0.0)) as http:
        dear = chat(http, "dear").json()["dear"]
        assert dear["agent_profiles"] is None
        assert not any("profile" in a or "style" in a for rnd in dear["rounds"] for a in rnd["agents"])
        assert http.get("/health").json()["backend"]["agent_profiles"] is None


# ---------------------------------------------------------------------------------------------------
# Backends, budgets, the context


def test_a_profile_on_another_backend_runs_beside_the_shared_batch(policy, monkeypatch):
    """Agent 1 on its own `sim` backend, agents 0 and 2 on the server's (`llm`, through the shared batch): debates of
    every method, admitted together, each agent's requests go to its backend in its style and limit."""
    main = Recording()
    scheduler = scheduler_of(policy, main, "cot,sim:direct:24,cot", batch_window_s=0.5)
    other = scheduler.debater.extra_backends["sim"]
    sent_other: list = []

    def record(requests, generate=other.generate):
        sent_other.extend(requests)
        return generate(requests)

    monkeypatch.setattr(other, "generate", record)
    events: queue.Queue = queue.Queue()
    questions = load_synthetic(n=2, seed=3, split="test")
    jobs = [DebateJob(q, seed=k, notify=events.put, method=m)
            for m in ("dear", "mad", "sc", "cot") for k, q in enumerate(questions)]
    for job in jobs:  # queued before the loop starts: one batch
        scheduler.submit(job)
    scheduler.start()
    try:
        done = wait_done(events, len(jobs))
    finally:
        scheduler.close()
    assert not [d.result.error for d in done if d.result.failed]
    pool = ["llm:cot", "sim:direct:24", "llm:cot"]
    for d in done:
        v = d.result.trace.n_agents
        assert all([t.profile for t in turns] == pool[:v] for turns in d.result.trace.rounds)
    assert {(r.metadata["agent"], r.metadata["style"], r.max_tokens) for r in main.requests} == {(0, "cot", 512),
                                                                                                 (2, "cot", 512)}
    assert {(r.metadata["agent"], r.metadata["style"], r.max_tokens) for r in sent_other} == {(1, "direct", 24)}
    assert all(prompts.DIRECT_STRUCTURE in r.messages[1].content for r in sent_other)
    stats = scheduler.stats
    assert stats.max_engines_per_step >= 2 and 0 < stats.backend_calls <= stats.steps


def test_the_budget_check_adds_each_agents_limit(policy):
    scheduler = scheduler_of(policy, "sim", POOL)
    dear = scheduler.methods["dear"]
    assert dear.turn_limits == [512, 24, 512] and dear.round_worst_case == 1048
    assert scheduler.methods["cot"].round_worst_case == 512
    with pytest.raises(BudgetTooSmall, match=r"up to 512 \+ 24 \+ 512 completion tokens .* = 1048; ask for at "
                                             r"least 1048"):
        scheduler.check_budget("dear", 1000)
    scheduler.check_budget("dear", 1048)
    scheduler.check_budget("cot", 600)
    scheduler.close()


def test_the_context_check_takes_each_agents_limit_style_and_backend(policy):
    main = Recording()
    q = make_question("How many words are in this question? " + "word " * 600, "integer")
    n0 = max(_count(main, prompts.round0_messages(q, style=s), {}) for s in prompts.STYLES)
    main.context_length = n0 + 100  # room for a 64-token turn, not for the server's --max-tokens (512)
    fits = scheduler_of(policy, main, "cot:64,direct:16,cot:64")
    fits.check_context(q, "majority")
    with pytest.raises(ContextTooLong, match=r"the answer of agent 2 \(profile llm:cot\) may take up to 512 more "
                                             r"\(the server's --max-tokens\)"):
        scheduler_of(policy, main, "cot:64,direct:16,cot").check_context(q, "majority")
    with pytest.raises(ContextTooLong, match="each agent's answer may take up to 512 more"):  # as before profiles
        scheduler_of(policy, main, None).check_context(q, "majority")
    # an agent on a backend of its own is checked against that backend's context (sim's: 32768 tokens)
    scheduler_of(policy, main, "cot:64,sim:cot,cot:64").check_context(q, "majority")


# ---------------------------------------------------------------------------------------------------
# The command line


def test_bad_profiles_stop_the_server_at_start_up_naming_the_flag(policy, capsys):
    from dear.cli import USER_ERRORS, exit_code
    from dear.export import ExportError
    from dear.serve.__main__ import PROG, main, parse_args

    for extra, start in ((["--llm", "sim", "--agent-profiles", "cot,direct"],
                          f"--agent-profiles lists 2 agents but the policy {policy} debates with V=3"),
                         (["--llm", "sim,sim", "--agent-profiles", "cot,cot,cot"],
                          "--llm must be one spec with --agent-profiles")):
        argv = ["--policy", str(policy), *extra]
        assert exit_code(lambda argv=argv: main(argv), PROG, errors=(*USER_ERRORS, ExportError), argv=argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"{PROG}: error: {start}") and len(err.splitlines()) == 1, err
    with pytest.raises(SystemExit):
        parse_args(["--policy", "p", "--agent-profiles", "cot,nosuch:cot"])
    assert "argument --agent-profiles: agent profile 1 ('nosuch:cot'): unknown LLM backend spec 'nosuch'" in \
        capsys.readouterr().err
    assert parse_args(["--policy", "p", "--agent-profiles", "cot,smoke:direct:16"]).agent_profiles == \
        parse_profiles("cot,smoke:direct:16")


# ---------------------------------------------------------------------------------------------------
# The real model


@pytest.mark.slow
def test_a_server_with_two_profiles_on_the_smoke_model(tmp_path):
    """A 2-agent policy served with `smoke:cot:32,smoke:direct:16`: each agent answers in its style within its
    limit on SmolLM2-135M (its answers are nonsense; the plumbing is what is checked)."""
    pytest.importorskip("openai")
    from tests.dear.serve.test_serve import ask, client, dear_server

    policy = export_random_policy(tmp_path / "policy", 2)
    with dear_server(policy, "smoke", tmp_path, "--agent-profiles", "smoke:cot:32,smoke:direct:16", "--n-rounds",
                     "1", "--kind", "integer", "--max-active", "1") as base:
        r = ask(client(base), "What is 12 + 30?", seed=3, extra_body={"dear_texts": True})
    dear = r.model_extra["dear"]
    assert dear["agent_profiles"] == ["smoke:cot:32", "smoke:direct:16"] and dear["backend"].startswith("smoke:")
    assert len(dear["rounds"]) == 2
    for rnd in dear["rounds"]:
        cot, direct = rnd["agents"]
        assert (cot["profile"], cot["style"], direct["profile"], direct["style"]) == \
            ("smoke:cot:32", "cot", "smoke:direct:16", "direct")
        assert cot["text"] and direct["text"]
        assert 0 < cot["completion_tokens"] <= 32 and 0 < direct["completion_tokens"] <= 16
    assert dear["rounds"][1]["agents"][0]["peers"] in ([], [1])  # the policy chooses who reads whom
