"""The method catalog (dear/debate/methods.py) is the one list of methods: eval's specs, the server's methods and the
report's paired baselines all come from it, and an entry builds the same protocol for both applications."""

from __future__ import annotations

import pytest

from dear.debate import DebateConfig
from dear.debate import methods as C
from dear.confidence import TOP_LOGPROBS
from dear.debate.protocols import (
    MADProtocol,
    MajorityProtocol,
    SamplingRuleProtocol,
    SelfConsistencyProtocol,
    StopWhenUnanimousProtocol,
)
from dear.debate.sampling_rules import DEFAULT_RULE_PARAMS, FittedParams, RuleParams

FITTED = FittedParams({"cisc-3": RuleParams(tau=0.2), "confident-stop": RuleParams(tau=0.1, threshold=-0.12)},
                      "mean_logprob", {"fit_shelf": "test"})


def test_the_baselines_keep_the_committed_reports_order_and_the_server_its_methods():
    # summary.md prints one "Paired difference to" table per baseline present, in this order (committed reports
    # re-report byte-identically only if it holds)
    assert C.BASELINES == ("mad", "majority", "sc", "adaptive-sc-2", "adaptive-sc-3", "adaptive-sc-2-from-2", "cot")
    rules = {"adaptive-sc-2", "adaptive-sc-3", "adaptive-sc-2-from-1", "adaptive-sc-2-from-2", "adaptive-sc-3-from-1",
             "adaptive-sc-3-from-2", "esc-2", "esc-3", "cisc-3", "confident-stop"}
    assert set(C.SERVED) == {"mad", "mad-stop", "sc", "cot", "majority"} | rules
    assert "read-strongest" in C.METHODS and "read-strongest" not in C.DEFAULT_METHODS


def test_an_entry_builds_each_method_live_on_the_given_settings():
    base = DebateConfig(n_agents=3, n_rounds=2, temperature0=0.5, top_p0=0.8)
    built = {name: C.METHODS[name].make(base, samples=9, fitted=FITTED) for name in C.SERVED}
    assert built["cot"][0].n_agents == 1 and built["cot"][0].n_rounds == 0
    assert type(built["cot"][1]) is MajorityProtocol and built["cot"][1].name == "cot"
    assert isinstance(built["mad"][1], MADProtocol) and built["mad"][1].n_rounds == 2
    stop = built["mad-stop"][1]
    assert isinstance(stop, StopWhenUnanimousProtocol) and (stop.temperature, stop.top_p) == (0.5, 0.8)
    sc = built["sc"][1]
    assert isinstance(sc, SelfConsistencyProtocol) and sc.n_samples == 9 and built["sc"][0] == base
    assert [n for n in C.SERVED if C.METHODS[n].exchanges] == ["mad", "mad-stop"]
    with pytest.raises(ValueError, match="'dear' .* no protocol of its own"):
        C.METHODS["dear"].make(base, 9)


def test_a_rule_is_served_from_its_first_samples_and_a_confidence_rule_with_its_fitted_parameters():
    base = DebateConfig(n_agents=3, n_rounds=2)
    config, proto = C.METHODS["adaptive-sc-2-from-1"].make(base, 9)
    assert isinstance(proto, SamplingRuleProtocol) and config.start_width == 1 and proto.n_rounds == 8
    assert config.logprobs is None and proto.decision == "all-answers"
    config, proto = C.METHODS["cisc-3"].make(base, 9, FITTED)
    assert (config.logprobs, config.vote_tau, config.start_width) == (TOP_LOGPROBS, 0.2, 3)
    assert proto.decision == "confidence-weighted"
    assert C.METHODS["confident-stop"].make(base, 9, FITTED)[1].params == FITTED.rules["confident-stop"]
    with pytest.raises(ValueError, match="'confident-stop' needs fitted rule parameters"):
        C.METHODS["confident-stop"].make(base, 9)
    with pytest.raises(ValueError, match="no fitted parameters for rule 'cisc-3'"):
        C.METHODS["cisc-3"].make(base, 9, FittedParams({}, "mean_logprob", {}))


def test_the_committed_fit_loads_and_a_params_file_round_trips(tmp_path):
    fitted = FittedParams.load(DEFAULT_RULE_PARAMS)
    assert {"cisc-3", "confident-stop"} <= set(fitted.rules)
    assert "gsm8k-train" in fitted.provenance["fit_shelf"]  # fitted on training questions only
    path = tmp_path / "p.json"
    path.write_text(FITTED.to_json())
    assert FittedParams.load(path) == FITTED
    path.write_text(FITTED.to_json().replace('"mean_logprob"', '"margin"'))
    with pytest.raises(ValueError, match="p.json: fitted on confidence summary 'margin'"):
        FittedParams.load(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FittedParams.load(tmp_path / "none.json")


def test_eval_builds_the_catalogs_protocols_and_its_own_samples_over_round0():
    from eval import methods as M

    base = DebateConfig(n_agents=3, n_rounds=2)
    for name in ("cot", "mad", "mad-stop", "read-strongest"):
        run, (config, proto) = M.build(M.METHODS[name], base, 9), C.METHODS[name].make(base, 9)
        assert run.config == config and type(run.protocol) is type(proto)
    # self-consistency over the stored round 0: a nine-agent round 0 and its plurality, nothing generated live
    sc = M.build(M.METHODS["sc"], base, 9)
    assert sc.config.n_agents == 9 and isinstance(sc.protocol, MajorityProtocol)


def test_the_catalog_refuses_a_baseline_rank_twice_and_a_dear_method_with_a_protocol(monkeypatch):
    mad = C.METHODS["mad"]
    monkeypatch.setitem(C.METHODS, "mad-twin", C.MethodSpec("mad-twin", "MAD twin", "debate", "", baseline=1,
                                                            build=mad.build, protocol="mad"))
    with pytest.raises(ValueError, match="baseline ranks must be 1..8 once each"):
        C._check_catalog()
    monkeypatch.setitem(C.METHODS, "mad-twin", C.MethodSpec("mad-twin", "x", "dear", "", build=mad.build))
    with pytest.raises(ValueError, match="'mad-twin': a dear method takes no build"):
        C._check_catalog()
