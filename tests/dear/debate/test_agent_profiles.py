"""Agent profiles (dear/debate/profiles.py): parsing and validation, the direct prompt, per-agent backends, styles and
token limits in the engine, byte-identical defaults, and the wiring into the training config, the env, eval.run,
the corpus collector and dear.infer (scripted and sim backends; the real smoke model is in
test_agent_profiles_smoke.py)."""

from __future__ import annotations

import argparse
import hashlib
import json

import numpy as np
import pytest

from dear.debate import DebateConfig, DebateEngine, MADProtocol, RoundControl, prompts
from dear.debate.cli_args import _agent_profiles, n_agents_of
from dear.debate.profiles import (
    AgentProfile,
    as_profiles,
    backend_specs,
    on_backend,
    parse_profiles,
    profile_at,
    profile_from_mapping,
)
from dear.llm.base import Completion
from dear.tasks.types import Question
from tests.dear.debate.test_debate_engine import FakeBackend, answer_text, gsm

DIRECT_REPLY = "Final answer: \\boxed{18}"


# ---------------------------------------------------------------- parsing and validation
def test_the_compact_form_is_read_from_the_right_so_specs_may_hold_colons():
    profiles = parse_profiles("local:cot, local:direct:64 ,smoke:cot,direct,cot:32")
    assert [(p.backend, p.style, p.max_tokens) for p in profiles] == [
        ("local", "cot", None), ("local", "direct", 64), ("smoke", "cot", None), (None, "direct", None),
        (None, "cot", 32)]
    (gguf, url) = parse_profiles("local:/models/x.gguf:direct,openai:http://h:8000/v1#m:cot:128")
    assert (gguf.backend, gguf.style) == ("local:/models/x.gguf", "direct")
    assert (url.backend, url.style, url.max_tokens) == ("openai:http://h:8000/v1#m", "cot", 128)
    for p in (*profiles, gguf, url):  # the name is the compact form again
        assert parse_profiles(p.name) == (p,)
    assert AgentProfile().name == "cot"


@pytest.mark.parametrize("text, match", [
    ("local", r"agent profile 0 \('local'\): the style must be one of cot, direct"),
    ("local:cot,smoke:cto", r"agent profile 1 \('smoke:cto'\): the style must be one of cot, direct.*got 'cto'"),
    ("cot,direct:0", r"agent profile 1 \('direct:0'\): the token limit must be >= 1"),
    ("cot,,direct", r"agent profile 1 is empty"),
    (":cot", r"agent profile 0 \(':cot'\): empty backend"),
    ("smok:cot", r"agent profile 0 \('smok:cot'\): unknown LLM backend spec 'smok'"),
    ("openai:http://h:8000", r"agent profile 0 .*the style must be one of"),  # no style: where would the spec end?
])
def test_a_bad_profile_is_named_by_its_position_and_problem(text, match):
    with pytest.raises(ValueError, match=match) as e:
        parse_profiles(text)
    assert "[BACKEND:]STYLE[:MAX_TOKENS]" in str(e.value)
    with pytest.raises(argparse.ArgumentTypeError, match=match):  # the argparse type: same message
        _agent_profiles(text)


def test_the_dataclass_and_config_mappings_name_the_bad_field():
    with pytest.raises(ValueError, match=r"AgentProfile.style must be one of cot, direct, pot, got 'chain'"):
        AgentProfile(style="chain")
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match="AgentProfile.max_tokens must be an integer >= 1"):
            AgentProfile(max_tokens=bad)
    with pytest.raises(ValueError, match="AgentProfile.backend must be"):
        AgentProfile(backend=" ")
    with pytest.raises(ValueError, match=r"env.agent_profiles\[1\].style: must be one of"):
        as_profiles([{"style": "cot"}, {"style": "cto"}], "env.agent_profiles")
    with pytest.raises(ValueError, match=r"x\[0\]: unknown key\(s\) \['temperature'\]"):
        profile_from_mapping({"temperature": 0.3}, "x[0]")
    with pytest.raises(ValueError, match=r"x\[0\].backend: unknown LLM backend spec 'gpt'"):
        profile_from_mapping({"backend": "gpt"}, "x[0]")
    with pytest.raises(ValueError, match=r"x\[2\] \('cot:x'\)"):
        as_profiles(["cot", AgentProfile(), "cot:x"], "x")
    with pytest.raises(ValueError, match="no profiles"):
        as_profiles([], "x")
    assert profile_from_mapping({"max_tokens": 64}, "x") == AgentProfile(max_tokens=64)


def test_pool_helpers_and_the_agent_count():
    pool = parse_profiles("cot,smoke:direct:16")
    assert [profile_at(pool, k).name for k in range(5)] == ["cot", "smoke:direct:16", "cot", "smoke:direct:16", "cot"]
    assert profile_at(None, 7) == AgentProfile()
    resolved = on_backend(pool, "local")
    assert [p.name for p in resolved] == ["local:cot", "smoke:direct:16"]
    assert backend_specs(resolved) == ["local", "smoke"]
    assert n_agents_of(pool, None) == 2 and n_agents_of(pool, 2) == 2 and n_agents_of(None, 4) == 4
    with pytest.raises(ValueError, match="--agent-profiles lists 2 agents but --n-agents is 3"):
        n_agents_of(pool, 3)


# ---------------------------------------------------------------- the direct prompt
def test_the_direct_prompt_asks_for_the_answer_line_alone_and_its_reply_parses():
    q = gsm(0)
    (_, user) = prompts.round0_messages(q, style="direct")
    assert prompts.DIRECT_STRUCTURE in user.content and "Janet has 0 ducks" in user.content
    assert "step by step" not in user.content and "Reasoning:" not in user.content
    assert "inside \\boxed{}, for example \\boxed{" in user.content  # the answer's form is still asked for
    assert prompts.extract(DIRECT_REPLY, q, style="direct") == "18"
    # an echo of the direct prompt's template line is not an answer; the agent's own line is
    echoed = f"{prompts.DIRECT_STRUCTURE}\n{DIRECT_REPLY}"
    assert prompts.extract(echoed, q, style="direct") == "18"
    assert prompts.extract(prompts.DIRECT_STRUCTURE, q, style="direct") is None
    choice = Question(id="c", task="gpqa", question="Which?", gold="B", kind="choice", choices=("x", "y"))
    (_, user) = prompts.round0_messages(choice, style="direct")
    assert "letter of the single correct option" in user.content and "step by step" not in user.content
    with pytest.raises(ValueError, match="unknown reply style 'terse'"):
        prompts.round0_messages(q, style="terse")


def test_exchange_turns_keep_the_style_in_both_layouts():
    q = gsm(0)
    own = prompts.ShownAnswer(0, "r", "c", "18")
    peer = prompts.ShownAnswer(1, "r1", "c1", "17")
    single = prompts.exchange_messages(q, own, [peer], style="direct")[-1].content
    assert single.endswith(prompts.STYLES["direct"].instructions(q)) and prompts.RECONSIDER_DIRECT in single
    assert "step by step" not in single
    alone = prompts.exchange_messages(q, own, [], style="direct")[-1].content
    assert prompts.RECONSIDER_ALONE_DIRECT in alone
    ex = prompts.Exchange(DIRECT_REPLY, own, (peer,))
    multi = prompts.multiturn_messages(q, [ex], style="direct")
    assert multi[1].content == prompts.round0_messages(q, style="direct")[1].content
    assert multi[-1].content.endswith(prompts.STYLES["direct"].instructions(q))


# ---------------------------------------------------------------- the engine
def _script(request):
    """cot agents reason; a direct agent (its prompt says so) answers with the final line alone."""
    if prompts.DIRECT_STRUCTURE in request.messages[1].content:
        return DIRECT_REPLY
    return answer_text(request.metadata["agent"], request.metadata["round"], "18")


@pytest.mark.parametrize("layout", ["multiturn", "single"])
def test_each_agent_gets_its_backend_style_and_token_limit(layout):
    strong, weak = FakeBackend(_script, model_id="strong-model"), FakeBackend(_script, model_id="weak-model")
    profiles = (AgentProfile("strong", "cot"), AgentProfile("weak", "direct", 16), AgentProfile("strong", "direct"))
    cfg = DebateConfig(n_agents=3, n_rounds=1, max_tokens=200, layout=layout, agent_profiles=profiles)
    engine = DebateEngine({"strong": strong, "weak": weak}, cfg)
    assert engine.agent_keys == ["strong", "weak", "strong"]
    assert engine.model_ids == ["strong-model", "weak-model", "strong-model"]
    (d,) = engine.run([gsm(0)], MADProtocol(3, 1))
    assert not d.failed and d.trace.model_ids == engine.model_ids
    # routing: one call per backend and round, each with its own agents
    assert [[r.metadata["agent"] for r in batch] for batch in strong.calls] == [[0, 2], [0, 2]]
    assert [[r.metadata["agent"] for r in batch] for batch in weak.calls] == [[1], [1]]
    for r, turns in enumerate(d.trace.rounds):
        assert [t.max_tokens for t in turns] == [200, 16, 200]
        assert [(t.profile, t.style) for t in turns] == [("strong:cot", "cot"), ("weak:direct:16", "direct"),
                                                         ("strong:direct", "direct")]
        assert [t.answer for t in turns] == ["18", "18", "18"]
        for t, p in zip(turns, profiles):
            assert t.messages[-1]["content"].endswith(prompts.STYLES[p.style].instructions(gsm(0))), (r, t.agent)
    req = weak.calls[1][0]
    assert (req.metadata["profile"], req.metadata["style"]) == ("weak:direct:16", "direct")
    back = json.loads(d.trace.to_json())
    assert back["rounds"][0][1]["profile"] == "weak:direct:16"


def test_fresh_samples_use_the_agents_round0_prompt_and_limit_and_the_limit_survives_a_small_context():
    be = FakeBackend(_script, context_length=4096)
    cfg = DebateConfig(n_agents=2, n_rounds=1, max_tokens=300,
                       agent_profiles=(AgentProfile(style="direct", max_tokens=24), AgentProfile()))
    engine = DebateEngine(be, cfg)
    (d,) = engine.start([gsm(0)])
    ctl = RoundControl(np.array([[False, True], [True, False]]), 0.7, 0.9, kinds=("fresh", "revise"))
    engine.step([d], [ctl])
    fresh, revise = d.trace.rounds[1]
    assert fresh.fresh and fresh.messages == d.trace.rounds[0][0].messages and fresh.max_tokens == 24
    assert revise.max_tokens == 300 and fresh.style == "direct" and revise.style == "cot"


def test_one_backend_serves_profiles_that_name_one_backend_and_bad_keys_are_named():
    be = FakeBackend(_script)
    cfg = DebateConfig(n_agents=2, agent_profiles=parse_profiles("sim:cot,sim:direct"))
    assert DebateEngine(be, cfg).agent_keys == ["default", "default"]
    with pytest.raises(ValueError, match="agent_profiles names several backends but one Backend was given"):
        DebateEngine(be, DebateConfig(n_agents=2, agent_profiles=parse_profiles("sim:cot,smoke:cot")))
    with pytest.raises(ValueError, match=r"agent_profiles: unknown backend keys \['smoke'\]"):
        DebateEngine({"sim": be, "x": be}, DebateConfig(n_agents=2,
                                                        agent_profiles=parse_profiles("sim:cot,smoke:cot")))
    keyed = (AgentProfile("a"), AgentProfile(style="direct"))  # a key of the mapping, not a spec, and none
    with pytest.raises(ValueError, match="several backends given"):
        DebateEngine({"a": be, "b": be}, DebateConfig(n_agents=2, agent_profiles=keyed))
    with pytest.raises(ValueError, match="agent_backends and agent_profiles both name backends"):
        DebateConfig(n_agents=2, agent_backends=("a", "b"), agent_profiles=keyed)


def test_a_config_wider_than_the_pool_continues_it_and_asdict_round_trips():
    from dataclasses import asdict, replace

    cfg = DebateConfig(n_agents=2, agent_profiles=parse_profiles("cot,direct:8"))
    wide = replace(cfg, n_agents=5)
    assert [wide.profile(k).name for k in range(5)] == ["cot", "direct:8", "cot", "direct:8", "cot"]
    assert [wide.agent_max_tokens(k) for k in range(3)] == [512, 8, 512]
    assert DebateConfig(**asdict(cfg)) == cfg  # asdict writes the profiles as mappings


# ---------------------------------------------------------------- the paper's debates stay byte-identical
# sha256 prefixes of the default debates' requests and traces, computed with the code before agent profiles
# existed (change them only with an intended change of the default prompts or traces).
GOLDEN = {"multiturn": ("4e6cafc9bfec1867", "f8ff5120602e0256"), "single": ("b6efc2e34beb3789", "4f319c41a6764d06")}
GOLDEN_ROUND0 = "adf5798f85b96220"


def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _questions() -> list[Question]:
    return [gsm(0), gsm(1, "7"),
            Question(id="c1", task="gpqa", question="Which?", gold="B", kind="choice", choices=("x", "y", "z")),
            Question(id="m1", task="math500", question="Find x.", gold="\\frac{1}{2}", kind="math")]


def _requests(be: FakeBackend) -> list:
    return [[([(m.role, m.content) for m in r.messages], r.seed, r.max_tokens, r.temperature, r.top_p) for r in b]
            for b in be.calls]


@pytest.mark.parametrize("layout", ["multiturn", "single"])
def test_default_prompts_seeds_and_traces_are_byte_identical(layout):
    qs = _questions()
    assert _h([[(m.role, m.content) for m in prompts.round0_messages(q)] for q in qs]) == GOLDEN_ROUND0
    be = FakeBackend()
    debates = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, layout=layout, max_tokens=100)).run(
        qs, MADProtocol(3, 2))
    # a trace now records its vote rule, the last round too (issue 56); apart from that key it is as it was
    rule = ', "decision": "last-round"}'
    assert all(d.trace.to_json().endswith(rule) for d in debates)
    assert (_h(_requests(be)), _h([d.trace.to_json().removesuffix(rule) + "}" for d in debates])) == GOLDEN[layout]
    assert '"profile"' not in debates[0].trace.to_json() and '"style"' not in debates[0].trace.to_json()
    # explicit default profiles send the very same requests (so response caches keep hitting)
    explicit = FakeBackend()
    cfg = DebateConfig(n_agents=3, n_rounds=2, layout=layout, max_tokens=100,
                       agent_profiles=(AgentProfile(style="cot"),) * 3)
    DebateEngine(explicit, cfg).run(qs, MADProtocol(3, 2))
    assert _requests(explicit) == _requests(be)


def test_traces_without_profile_keys_still_load():
    from dear.debate.trace import DebateTrace

    (d,) = DebateEngine(FakeBackend(), DebateConfig(n_agents=2, n_rounds=1)).run([gsm(0)], MADProtocol(2, 1))
    back = DebateTrace.from_json(d.trace.to_json())
    assert back == d.trace and back.rounds[0][0].profile is None


# ---------------------------------------------------------------- wiring: training config and env
def test_training_config_takes_one_profile_per_agent_on_the_run_backend():
    from dear.sim import SimBackend
    from train.build import make_vector_env
    from train.config import ConfigError, load_config

    base = ["rollout.envs_per_worker=2", "rollout.group_size=1", "rollout.episodes_per_iter=2"]
    cfg = load_config("sim-stylised", [*base, "env.agent_profiles=[{style: direct, max_tokens: 32}, {}, "
                                              "{backend: sim, style: cot}]"])
    venv = make_vector_env(cfg, SimBackend())
    try:
        assert [p.name for p in venv.core.engine.config.agent_profiles] == ["direct:32", "cot", "cot"]
    finally:
        venv.close()
    with pytest.raises(ConfigError, match=r"env.agent_profiles: 2 profiles for env.n_agents=3"):
        load_config("sim-stylised", ["env.agent_profiles=[{}, {}]"])
    with pytest.raises(ConfigError, match=r"env.agent_profiles\[1\].style: must be one of cot, direct"):
        load_config("sim-stylised", ["env.agent_profiles=[{}, {style: short}, {}]"])
    with pytest.raises(ConfigError, match=r"env.agent_profiles\[2\].backend: 'smoke' is not the run's backend"):
        load_config("sim-stylised", ["env.agent_profiles=[{}, {}, {backend: smoke}]"])
    assert load_config("sim-stylised").env.agent_profiles is None


def test_the_env_rejects_a_profile_backend_and_a_wrong_count():
    from envs.debate_env import DebateEnv

    with pytest.raises(ValueError, match=r"agent_profiles\[0\].backend: the env runs every agent on its one backend"):
        DebateEnv(n_questions=2, agent_profiles=[{"backend": "smoke"}, {}, {}])
    with pytest.raises(ValueError, match="agent_profiles has 2 profiles for n_agents=3"):
        DebateEnv(n_questions=2, agent_profiles=[{}, {}])
    env = DebateEnv(n_questions=2, agent_profiles=[{"style": "direct"}, {}, {}])
    env.reset(seed=0)
    assert [t.style for t in env.debate.trace.rounds[0]] == ["direct", "cot", "cot"]
    env.close()


# ---------------------------------------------------------------- wiring: eval.run, the corpus, dear.infer
def _eval_args(out, *extra):
    return ["--benchmarks", "synthetic", "--n", "3", "--llm", "sim", "--methods", "mad,majority,cot", "--seed", "0",
            "--out", str(out), "--batch", "3", "--n-boot", "50", "--no-progress", *extra]


def test_eval_run_stores_the_profiles_reports_per_agent_and_refuses_other_ones(tmp_path, capsys):
    from eval import run as eval_run

    out = tmp_path / "res"
    eval_run.main(_eval_args(out, "--agent-profiles", "cot,direct:32,sim:cot", "--n-rounds", "1"))
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["agent_profiles"] == ["sim:cot", "sim:direct:32", "sim:cot"] and settings["n_agents"] == 3
    mad = [json.loads(x) for x in (out / "traces" / "synthetic" / "mad.jsonl").read_text().splitlines()]
    assert [t["profile"] for t in mad[0]["rounds"][1]] == settings["agent_profiles"]
    assert [t["max_tokens"] for t in mad[0]["rounds"][1]] == [512, 32, 512]
    md = (out / "summary.md").read_text()
    section = md[md.index("## Per agent"):]
    assert "`sim:direct:32`" in section and "last-round acc %" in section
    assert section.count("| synthetic | MAD | ") == 3 + 2  # three agents, then the steps of both profiles
    assert section.count("| synthetic | Single CoT") == 1  # no exchange: no steps
    assert "Who moved to whose answer" in section and "| synthetic | MAD | `sim:direct:32` | `sim:cot` |" in section
    with pytest.raises(ValueError, match="agent_profiles: .* there vs .* now"):
        eval_run.main(_eval_args(out, "--agent-profiles", "cot,cot,cot", "--n-rounds", "1"))
    with pytest.raises(ValueError, match="--agent-profiles lists 3 agents but --n-agents is 2"):
        eval_run.main(_eval_args(tmp_path / "other", "--agent-profiles", "cot,direct,cot", "--n-agents", "2"))
    with pytest.raises(ValueError, match="--llm must be one spec with --agent-profiles"):
        eval_run.main([*_eval_args(tmp_path / "two", "--agent-profiles", "cot,cot"), "--llm", "sim,sim"])
    with pytest.raises(SystemExit):
        eval_run.parse_args(_eval_args(out, "--agent-profiles", "cot,quick"))
    assert "agent profile 1 ('quick')" in capsys.readouterr().err


def test_an_eval_directory_written_before_profiles_resumes_without_them(tmp_path):
    from eval import run as eval_run

    out = tmp_path / "res"
    eval_run.main(_eval_args(out, "--n-rounds", "1"))
    stored = json.loads((out / "run.json").read_text())
    del stored["settings"]["agent_profiles"]
    (out / "run.json").write_text(json.dumps(stored))
    eval_run.main(_eval_args(out, "--n-rounds", "1"))  # the same settings: resumes
    assert "## Per agent" not in (out / "summary.md").read_text()
    with pytest.raises(ValueError, match="agent_profiles: None there"):
        eval_run.main(_eval_args(out, "--n-rounds", "1", "--agent-profiles", "cot,direct,cot"))


def test_the_corpus_collector_records_the_profiles(tmp_path):
    from simworld import corpus
    from simworld.corpus import read_corpus

    out = tmp_path / "c"
    argv = ["--llm", "sim", "--task", "synthetic", "--layout", "single", "--out", str(out), "--n-logging", "2",
            "--n-mad", "1", "--agent-profiles", "cot,direct:40"]
    assert corpus.main(argv) == 0
    settings = json.loads((out / "settings.json").read_text())
    assert settings["agent_profiles"] == ["sim:cot", "sim:direct:40"] and settings["n_agents"] == 2
    records = read_corpus(out)
    assert len(records) == 3
    assert [t["profile"] for t in records[0]["trace"]["rounds"][0]] == ["sim:cot", "sim:direct:40"]
    assert "Agent profiles" in (out / "PROVENANCE.md").read_text()
    with pytest.raises(ValueError, match="was made with other settings"):
        corpus.main([*argv[:-1], "cot,cot"])
    with pytest.raises(ValueError, match="--llm must be one spec with --agent-profiles"):
        corpus.main(["--llm", "sim,sim", *argv[2:]])


def test_regulated_debater_runs_a_mixed_pool_and_checks_its_size(tmp_path):
    import torch

    from dear.export import export_policy
    from dear.infer import RegulatedDebater
    from dear.policy import JointPolicy, PolicyConfig
    from dear.sim import SimBackend
    from dear.tasks.synthetic import load_synthetic

    torch.manual_seed(0)
    exported = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "policy", encoder="hashing",
                             training={"n_rounds": 2, "synthetic": True, "llm": "sim"})
    with RegulatedDebater(exported, "sim", agent_profiles=parse_profiles("cot,direct:24,cot")) as debater:
        (res,) = debater.run(load_synthetic(n=1, seed=0, split="test"))
        assert [t.profile for t in res.trace.rounds[-1]] == ["sim:cot", "sim:direct:24", "sim:cot"]
        assert [t.max_tokens for t in res.trace.rounds[0]] == [512, 24, 512]
    # a profile on another backend gets its own, which the debater builds and closes
    fake = FakeBackend(lambda r: Completion(DIRECT_REPLY, 5, 5, "stop", 0.0))
    with RegulatedDebater(exported, fake, agent_profiles=parse_profiles("direct,sim:cot,direct")) as debater:
        assert debater.engine.agent_keys == ["llm", "sim", "llm"]
        assert isinstance(debater.extra_backends["sim"], SimBackend)
    with pytest.raises(ValueError, match="agent profiles list 2 agents but the policy debates with V=3"):
        RegulatedDebater(exported, "sim", agent_profiles=parse_profiles("cot,cot"))


def test_read_strongest_reads_the_first_profiles_agents_only():
    from dear.debate.protocols import make_protocol
    from eval.methods import DEFAULT_METHODS, parse_methods

    pool = DebateConfig(n_agents=3, agent_profiles=("local:cot", "local:cot", "local:direct"))
    mask = make_protocol("read-strongest", pool).controls([None])[0].mask
    assert mask.tolist() == [[False, True, False], [True, False, False], [True, True, False]]
    weak = make_protocol("read-strongest:direct", pool).controls([None])[0].mask  # by name, backend left out
    assert weak.tolist() == [[False, False, True], [False, False, True], [False, False, False]]
    same = make_protocol("read-strongest", DebateConfig(n_agents=3)).controls([None])[0].mask
    assert same.tolist() == (~np.eye(3, dtype=bool)).tolist()  # one profile: MAD's full mesh
    with pytest.raises(ValueError, match=r"no agent has the profile 'smoke'; the pool is \['local:cot'"):
        make_protocol("read-strongest:smoke", pool)
    assert "read-strongest" not in DEFAULT_METHODS and parse_methods("read-strongest")[0].protocol == "read-strongest"
