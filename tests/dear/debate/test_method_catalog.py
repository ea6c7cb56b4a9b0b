"""The method catalog (dear/debate/methods.py) is the one list of methods: eval's specs, the server's methods and the
report's paired baselines all come from it, and an entry builds the same protocol for both applications."""

from __future__ import annotations

import pytest

from dear.debate import DebateConfig
from dear.debate import methods as C
from dear.debate.protocols import (
    MADProtocol,
    MajorityProtocol,
    SelfConsistencyProtocol,
    StopWhenUnanimousProtocol,
)


def test_the_baselines_keep_the_committed_reports_order_and_the_server_its_methods():
    # summary.md prints one "Paired difference to" table per baseline present, in this order (committed reports
    # re-report byte-identically only if it holds)
    assert C.BASELINES == ("mad", "majority", "sc", "adaptive-sc-2", "adaptive-sc-3", "adaptive-sc-2-from-2", "cot")
    assert set(C.SERVED) == {"mad", "mad-stop", "sc", "cot", "majority"}
    assert "read-strongest" in C.METHODS and "read-strongest" not in C.DEFAULT_METHODS


def test_an_entry_builds_each_method_live_on_the_given_settings():
    base = DebateConfig(n_agents=3, n_rounds=2, temperature0=0.5, top_p0=0.8)
    built = {name: C.METHODS[name].make(base, samples=9) for name in C.SERVED}
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
