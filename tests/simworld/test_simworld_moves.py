"""The simulated world's move: `dear.sim` (the library) and `simworld/` (the application) replace `dear.llm.sim` and
`eval.{corpus,fit_corpus,fit_sim,evidence_match}`, whose old paths still work (with a FutureWarning for the
`eval` ones); fitted worlds that training reads live in `worlds/`, byte-identical to the fit's outputs."""

from __future__ import annotations

import hashlib
import importlib
import json
import subprocess
import sys
import warnings

import pytest
import yaml

from tests import ROOT

ALIASES = {"eval.corpus": "simworld.corpus", "eval.fit_corpus": "simworld.fit",
           "eval.evidence_match": "simworld.evidence_match", "eval.fit_sim": "simworld.map_fit"}


@pytest.mark.parametrize("old, new", sorted(ALIASES.items()))
def test_old_commands_warn_and_run_the_new_ones(old, new):
    r = subprocess.run([sys.executable, "-m", old, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "FutureWarning" in r.stderr and f"python -m {new}" in r.stderr
    assert r.stdout.startswith(f"usage: python -m {new}")


def test_old_module_paths_give_the_new_objects_with_a_warning():
    from dear.debate import corpus_file
    from simworld import evidence_match, map_fit, mle, validation
    from simworld import fit as simfit

    def old(name: str):
        sys.modules.pop(name, None)
        with pytest.warns(FutureWarning, match=f"{name} has moved to {ALIASES[name]}"):
            return importlib.import_module(name)

    assert old("eval.corpus").read_corpus is corpus_file.read_corpus
    fit_corpus = old("eval.fit_corpus")
    assert fit_corpus.run is simfit.run and fit_corpus.NullModel is validation.NullModel
    assert old("eval.evidence_match").run is evidence_match.run
    fit_sim = old("eval.fit_sim")
    assert fit_sim.fit_mle is mle.fit_mle and fit_sim.fit is map_fit.fit and fit_sim.PENALISED is mle.PENALISED


def test_the_llm_path_of_the_simulator_is_a_plain_re_export():
    import dear.sim
    from dear.llm.registry import make_backend

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from dear.llm import sim as old

    assert old.SimBackend is dear.sim.SimBackend and old.SimParams is dear.sim.SimParams
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
    """A learning check made with the old paths (the suite of 2026-12-04, archived) has today's resolved config —
    but for the group size, the annealed learning rates, the joint behavior ratio and the standardised inputs, which
    it ran with their earlier values — once its moved file paths are read as their new ones."""
    from dear.deprecation import with_moved_files
    from train.config import load_config, with_settings_before_the_key

    saved = json.loads((ROOT / "results/archive/learning-suite-group1/fitted/settings.json").read_text())
    now = json.loads(json.dumps(load_config("sim", [*saved["overrides"], "rollout.group_size=1",
                                                    "happo.anneal_lr=false", "happo.behavior_ratio=joint",
                                                    "happo.obs_norm=true", "logging.progress=false"]).to_dict(),
                                default=str))
    assert saved["resolved_config"] != now  # the stored paths are the old ones
    assert with_settings_before_the_key(with_moved_files(saved["resolved_config"])) == now
