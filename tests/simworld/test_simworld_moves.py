"""The simulated world's move: `dear.sim` (the library) and `simworld/` (the application) replace `dear.llm.sim` and
`eval.{corpus,fit_corpus,fit_sim,evidence_match}` (the `eval` paths are gone: CHANGELOG.md); fitted worlds that
training reads live in `worlds/`, byte-identical to the fit's outputs."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import yaml

from tests import ROOT


def test_the_simulator_has_one_path():
    import dear.sim
    from dear.llm.registry import make_backend

    assert importlib.util.find_spec("dear.llm.sim") is None  # the old path is gone (CHANGELOG.md)
    assert type(make_backend("sim")) is dear.sim.SimBackend


def test_the_fitted_world_is_an_input_copied_from_the_fits_outputs():
    options = yaml.safe_load((ROOT / "configs/sim.yaml").read_text())["llm"]["options"]
    world = ROOT / "worlds/gsm8k-fitted"
    assert options == {"params_file": "worlds/gsm8k-fitted/sim_params_synthetic_texts.json",
                       "text_bank": "worlds/gsm8k-fitted/text_bank.json.gz"}
    readme = (world / "README.md").read_text()
    for name in ("sim_params_synthetic_texts.json", "text_bank.json.gz"):
        data = (world / name).read_bytes()
        assert data == (ROOT / "results/corpus-gsm8k/evidence" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() in readme
    assert "python -m simworld.evidence_match --corpus results/corpus-gsm8k" in readme


def test_settings_saved_before_the_move_name_the_same_world():
    """A learning check made before the move (the suite of 2026-12-04, archived; its file paths converted once to
    `worlds/`) has today's resolved config — but for the group size, the annealed learning rates, the joint behavior
    ratio and the standardised inputs, which it ran with their earlier values."""
    from train.config import load_config, with_settings_before_the_key

    saved = json.loads((ROOT / "results/archive/learning-suite-group1/fitted/settings.json").read_text())
    now = json.loads(json.dumps(load_config("sim", [*saved["overrides"], "rollout.group_size=1",
                                                    "happo.anneal_lr=false", "happo.behavior_ratio=joint",
                                                    "happo.obs_norm=true", "logging.progress=false"]).to_dict(),
                                default=str))
    assert saved["resolved_config"] != now  # the keys it predates are missing
    assert with_settings_before_the_key(saved["resolved_config"]) == now
