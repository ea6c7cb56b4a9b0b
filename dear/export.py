"""Self-contained export of a trained DEAR policy (docs/DESIGN.md §10): safetensors weights + a JSON manifest.

    python -m dear.export runs/RUN_DIR exported/dear-gsm8k        # latest checkpoint of a run
    python -m dear.export runs/RUN_DIR/checkpoints/iter_000100 OUT  # a specific checkpoint
    python -m dear.export runs/RUN_DIR OUT --force                  # replace the export already in OUT

    from dear.export import load_exported
    exported = load_exported("exported/dear-gsm8k")
    act = exported.policy.act(obs.selection_obs, obs.b, obs.u, deterministic=True)

The artifact directory holds `policy.safetensors` (the selection and behavior actors; the critic is a
training-only part) and `manifest.json` (V, observation layout, pair order, action ranges, fusion rule,
encoder name, versions, the training backend and whether it was synthetic). Loading needs only torch,
safetensors and `dear.policy` — no trainer, Ray or gymnasium.

Verified files: the manifest records the sha256 of the weights file, checked at every load; exporting a
checkpoint first checks the checksums the trainer recorded (`checksums.json`), so a damaged checkpoint is
refused instead of being stamped with a fresh hash. Errors name the file. OUT must be new or empty unless
`force` (`--force`).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import dear
from dear.cli import run as run_cli
from dear.debate.engine import DebateConfig
from dear.debate.profiles import as_profiles, feature_vocabulary
from dear.integrity import (
    IntegrityError,
    atomic_write_text,
    read_json,
    sha256_file,
    verify_checkpoint_checksums,
)
from dear.llm.registry import is_synthetic
from dear.policy import (
    KINDS,
    RAW_BOUND,
    JointPolicy,
    PolicyConfig,
    behavior_obs_dim,
    observes_decision,
    pair_order,
    selection_obs_dim,
)

log = logging.getLogger(__name__)

FORMAT = "dear-policy"
FORMAT_VERSION = 1
WEIGHTS_FILE = "policy.safetensors"
MANIFEST_FILE = "manifest.json"


class ExportError(IntegrityError):
    """An export artifact or checkpoint is missing, damaged, malformed or inconsistent (the message names it)."""


@dataclass
class ExportedPolicy:
    policy: JointPolicy  # eval mode; use act(..., deterministic=True) for inference
    manifest: dict[str, Any]
    path: Path

    @property
    def n_agents(self) -> int:
        return int(self.manifest["n_agents"])

    @property
    def encoder(self) -> str:
        return str(self.manifest["encoder"])

    @property
    def synthetic(self) -> bool:
        return bool(self.manifest.get("training", {}).get("synthetic", False))

    @property
    def fixed_temperature(self) -> float | None:
        """The one temperature the policy samples at when its behavior is fixed; None when it learned one."""
        c = self.policy.config
        return c.fixed_temperature if c.behavior_mode == "fixed" else None

    @property
    def n_rounds(self) -> int | None:
        """Exchange rounds the policy was trained for (None = unknown)."""
        value = self.manifest.get("training", {}).get("n_rounds")
        return None if value is None else int(value)

    @property
    def answer_aware(self) -> float:
        """Weight of parsed-answer agreement in the evidence the policy was trained on (0: the paper's e_ij)."""
        return float(self.manifest.get("training", {}).get("answer_aware") or 0.0)

    @property
    def start_width(self) -> int | None:
        """Samples before the policy's first decision (None: every agent answers in round 0)."""
        value = self.manifest.get("training", {}).get("start_width")
        return None if value is None else int(value)

    @property
    def max_samples(self) -> int | None:
        """The world's budget of independent samples a debate it learned in (None: none, or an export from before the
        setting); its debates keep it, since the policy never met a state past it."""
        value = self.manifest.get("training", {}).get("max_samples")
        return None if value is None else int(value)

    @property
    def fresh_per_round(self) -> int | None:
        """New independent samples a round its world allowed (None: no limit, or an export from before the setting)."""
        value = self.manifest.get("training", {}).get("fresh_per_round")
        return None if value is None else int(value)

    @property
    def silent(self) -> bool:
        """Trained with silent turns: an agent that reads nobody keeps its answer without a model call."""
        return bool(self.manifest.get("training", {}).get("silent", False))

    @property
    def decision(self) -> str:
        """The final vote's rule the policy was trained with (last-round for exports from before the setting)."""
        return str(self.manifest.get("training", {}).get("decision") or "last-round")

    @property
    def vote_tau(self) -> float:
        """The confidence-weighted vote's softmax temperature it was trained with (the engine's default otherwise)."""
        return float(self.manifest.get("training", {}).get("vote_tau") or DebateConfig.vote_tau)

    @property
    def reads_confidence(self) -> bool:
        """Whether its debates need the samples' log-probabilities: it observes confidence or its vote weighs by it."""
        return bool(self.policy.config.confidence_feature) or self.decision == "confidence-weighted"


def choose_encoder(trained: str, requested: str | None = None, allow_mismatch: bool = False) -> str:
    """The encoder a policy runs with: the one it was trained with (named in its manifest). Another encoder
    changes every observation the policy sees (e_ij, beliefs, uncertainty), so asking for one is an error unless
    `allow_mismatch` (flag `--allow-encoder-mismatch`) says the user means it."""
    if requested is None or requested == trained:
        return trained
    if not allow_mismatch:
        raise ValueError(f"encoder {requested!r} differs from {trained!r}, the one the policy was trained with: its "
                         f"observations would change; pass --allow-encoder-mismatch to run it anyway")
    log.warning("encoder %s differs from the one the policy was trained with (%s)", requested, trained)
    return requested


def build_manifest(policy: JointPolicy, encoder: str, training: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = policy.config
    v = cfg.n_agents
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dear_version": dear.__version__,
        "torch_version": torch.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "n_agents": v,
        "encoder": encoder,
        "fusion": cfg.fusion,
        "policy_config": {k: list(x) if isinstance(x, tuple) else x for k, x in cfg.to_dict().items()},
        "observation": {
            "selection": {"dim": selection_obs_dim(v, cfg.actions, cfg.n_profiles, cfg.decision_features,
                                                       cfg.confidence_feature),
                          "layout": "per agent i in order: [b_i (V), u_i, one_hot(i) (V)]" + (
                              "; then per agent i its profile's one-hot over policy_config.profiles"
                              if cfg.n_profiles else "") + (
                              "; then per agent i its confidence in its answer, exp(mean token log-probability) of "
                              "the sample it holds (0 while waiting)" if cfg.confidence_feature else "") + (
                              "; then [round / R, leader's votes / V, (leader - runner-up votes) / V] over the "
                              "answers the final vote counts" if observes_decision(cfg.actions, cfg.decision_features)
                              else "")},
            "behavior": {"dim": behavior_obs_dim(v, cfg.n_profiles),
                         "layout": "per agent: [E_hat_i (V), u_hat_i, conflict_i, one_hot(i) (V)] after fusing "
                                   "agent i's opinion with the peers it reads; conflict_i = 0 under fusion 'mean'" + (
                                       "; then its profile's one-hot over policy_config.profiles"
                                       if cfg.n_profiles else "")},
            "evidence": "e_ij = (2 + cos(h_i, h_j) + cos(c_i, c_j)) / 4 over reasoning (h) and conclusion (c)",
        },
        "action": {
            "pair_order": [list(p) for p in pair_order(v)],
            "pairs_meaning": "pairs[k] = 1 for pair_order[k] = (i, j): agent i reads agent j's previous answer",
            "set": cfg.actions,  # extended: the selection net also gives 3 kind logits per agent and a stop logit
            **({"kinds": list(KINDS), "heads": "logits = [pairs (V(V-1)), kinds (V x 3, agent-major), stop (1)]"}
               if cfg.actions == "extended" else {}),
            "behavior": "raw (V, 2) (z_T, z_P) per agent, clipped to +-raw_bound",
            "raw_bound": RAW_BOUND,
            "temperature_range": list(cfg.temperature_range),
            "top_p_range": list(cfg.top_p_range),
            "behavior_map": cfg.behavior_map,
            "mapping": ("T = T_min + (T_max - T_min) * g(z_T); top_p = P_min + (P_max - P_min) * g(z_P); g = sigmoid"
                        if cfg.behavior_map == "sigmoid" else
                        "T = T_min + (T_max - T_min) * g(z_T); top_p = P_min + (P_max - P_min) * g(z_P); "
                        "g(z) = clip((z + 1) / 2, 0, 1)"),
        },
        "training": dict(training or {}),
    }


def check_export_dir(out_dir: str | Path, force: bool = False) -> Path:
    """OUT must be a new or empty directory, or `force`; checked before any work. Creates nothing."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"{out}: directory is not empty; choose a new directory or pass --force (force=True) "
                          f"to replace the export in it")
    return out


def export_policy(policy: JointPolicy, out_dir: str | Path, encoder: str,
                  training: dict[str, Any] | None = None, force: bool = False) -> Path:
    """Write `policy.safetensors` + `manifest.json` into out_dir (new or empty unless `force`); returns out_dir.
    The manifest is written last, so an interrupted export is never mistaken for a complete one."""
    out = check_export_dir(out_dir, force)
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST_FILE).exists():
        (out / MANIFEST_FILE).unlink()
    tensors = {f"selection.{k}": v.detach().cpu().contiguous() for k, v in policy.selection.state_dict().items()}
    tensors.update({f"behavior.{k}": v.detach().cpu().contiguous() for k, v in policy.behavior.state_dict().items()})
    tmp = out / f".{WEIGHTS_FILE}.tmp"
    save_file(tensors, str(tmp), metadata={"format": FORMAT})
    tmp.replace(out / WEIGHTS_FILE)
    manifest = build_manifest(policy, encoder, training)
    manifest["weights_sha256"] = sha256_file(out / WEIGHTS_FILE)
    atomic_write_text(out / MANIFEST_FILE, json.dumps(manifest, indent=2))
    return out


# The policy `dear.infer` and `dear.serve` use when no --policy is given (package data; README inside): the
# extended action set, chosen by the real three-benchmark evaluation (README, "Results"). The paper's action set
# ships beside it for `--policy` (PAPER_POLICY).
POLICIES_DIR = Path(__file__).resolve().parent / "policies"
SHIPPED_POLICY = POLICIES_DIR / "sim-fitted-extended-v2"
PAPER_POLICY = POLICIES_DIR / "sim-fitted-v2"


def load_exported(path: str | Path, map_location: str = "cpu") -> ExportedPolicy:
    """Load an exported artifact; checks format, version, weights hash and layout against the manifest."""
    root = Path(path)
    mpath, wpath = root / MANIFEST_FILE, root / WEIGHTS_FILE
    if not root.exists():
        raise ExportError(f"{root}: does not exist (an exported policy is a directory that `python -m dear.export "
                          f"RUN_DIR OUT_DIR` writes)")
    if not mpath.exists() or not wpath.exists():
        hint = ""
        if (root / "checkpoints").is_dir() or (root / "config.yaml").exists():
            hint = f"; it is a training run: export it first with `python -m dear.export {root} OUT_DIR`"
        raise ExportError(f"{root}: not a DEAR export (needs {MANIFEST_FILE} and {WEIGHTS_FILE}){hint}")
    try:
        manifest = read_json(mpath, "export manifest")
    except IntegrityError as e:
        raise ExportError(str(e)) from None
    if not isinstance(manifest, dict):
        raise ExportError(f"{mpath}: top level must be a JSON object")
    if manifest.get("format") != FORMAT:
        raise ExportError(f"{mpath}: format is {manifest.get('format')!r}, expected {FORMAT!r}")
    if int(manifest.get("format_version", -1)) > FORMAT_VERSION:
        raise ExportError(f"{mpath}: format_version {manifest.get('format_version')} is newer than this "
                          f"dear ({FORMAT_VERSION}); upgrade dear")
    sha = manifest.get("weights_sha256")
    if not sha:
        raise ExportError(f"{mpath}: has no weights_sha256, so {wpath} cannot be verified")
    if sha256_file(wpath) != sha:
        raise ExportError(f"{wpath}: sha256 does not match manifest.json (corrupt or replaced weights)")
    try:
        cfg = PolicyConfig.from_dict(dict(manifest["policy_config"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"{mpath}: bad policy_config: {e}") from None
    if cfg.n_agents != int(manifest.get("n_agents", -1)):
        raise ExportError(f"{mpath}: n_agents {manifest.get('n_agents')} != policy_config.n_agents {cfg.n_agents}")
    policy = JointPolicy(cfg)
    load_actors(policy, _load_tensors(wpath, map_location), f"{wpath}: {{part}} weights do not fit the manifest's "
                                                             "layout")
    policy.eval()
    return ExportedPolicy(policy=policy, manifest=manifest, path=root)


def _load_tensors(path: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Safetensors file -> tensors; unreadable files and NaN/inf weights raise ExportError naming the file."""
    try:
        tensors = load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError) as e:
        raise ExportError(f"{path}: cannot be read (damaged or truncated?): {e}") from None
    bad = sorted(k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise ExportError(f"{path}: non-finite values in {bad[:5]}")
    return tensors


# ---------------------------------------------------------------------------------------------------
# From a training checkpoint (files only: dear/ never imports train/)


def _checkpoint_dir(path: Path) -> Path:
    if (path / "model.safetensors").exists():
        return path
    latest = path / "checkpoints" / "latest"
    if latest.exists():
        name = latest.read_text(errors="replace").strip()
        ckpt = latest.parent / name
        if not name or not (ckpt / "model.safetensors").exists():
            raise ExportError(f"{latest}: names {name!r}, which is not a checkpoint in {latest.parent}")
        return ckpt
    raise ExportError(f"{path}: neither a checkpoint directory (model.safetensors) nor a run directory "
                      f"(checkpoints/latest)")


def _sim_params_setting(llm: dict[str, Any]) -> Any:
    """Where a sim run's parameters came from: its `params_file` (a fitted world), else its `params` overrides."""
    options = llm.get("options") or {}
    return options.get("params_file") or options.get("params")


def _profile_vocabulary(env: dict[str, Any]) -> tuple[str, ...] | None:
    """The profile feature's vocabulary of a run config's env section (as training built it), None without it."""
    if not env.get("profile_feature"):
        return None
    return feature_vocabulary(as_profiles(env.get("agent_profiles"), "env.agent_profiles"))


def load_actors(policy: JointPolicy, tensors: dict[str, torch.Tensor], error: str) -> JointPolicy:
    """Load the two actors' weights from one flat state dict (`selection.*`, `behavior.*`: an export's or a trainer
    checkpoint's, whose critic keys are ignored). A mismatch raises ExportError(`error` with {part} filled in)."""
    for part, module in (("selection", policy.selection), ("behavior", policy.behavior)):
        try:
            module.load_state_dict({k[len(part) + 1:]: v for k, v in tensors.items() if k.startswith(part + ".")})
        except RuntimeError as e:
            raise ExportError(error.format(part=part) + f": {e}") from None
    return policy


def export_checkpoint(checkpoint_or_run: str | Path, out_dir: str | Path, force: bool = False) -> Path:
    """Export the actors of a trainer checkpoint (its config.yaml gives V, ranges, fusion, encoder) after
    verifying the checkpoint's checksums."""
    import yaml

    check_export_dir(out_dir, force)
    ckpt = _checkpoint_dir(Path(checkpoint_or_run))
    try:
        verify_checkpoint_checksums(ckpt)
    except IntegrityError as e:
        raise ExportError(str(e)) from None
    try:
        cfg = yaml.safe_load((ckpt / "config.yaml").read_text())
        env, pol, llm = cfg["env"], cfg.get("policy", {}), cfg.get("llm", {})
    except FileNotFoundError:
        raise ExportError(f"{ckpt / 'config.yaml'}: missing") from None
    except (yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ExportError(f"{ckpt / 'config.yaml'}: cannot be parsed as a run config: {type(e).__name__}: {e}") from None
    try:
        pcfg = PolicyConfig(
            n_agents=env["n_agents"], selection_mode=pol.get("selection_mode", "learned"),
            behavior_mode=pol.get("behavior_mode", "learned"), fusion=env.get("fusion", "dst"),
            selection_hidden=pol.get("hidden", 64), behavior_hidden=pol.get("hidden", 64),
            log_std_init=pol.get("log_std_init", -0.5), temperature_range=tuple(env["temperature_range"]),
            top_p_range=tuple(env["top_p_range"]), fixed_temperature=pol.get("fixed_temperature", 0.7),
            fixed_top_p=pol.get("fixed_top_p", 0.9),
            behavior_map=pol.get("behavior_map", "sigmoid"),  # runs from before the key: the paper's sigmoid
            selection_bias_init=pol.get("selection_bias_init", 0.0), actions=env.get("actions", "paper"),
            kinds_mode=pol.get("kinds_mode", "learned"), stop_mode=pol.get("stop_mode", "learned"),
            stop_agree=pol.get("stop_agree", 1.0), profiles=_profile_vocabulary(env),
            decision_features=bool(env.get("decision_features", False)),
            turn_kinds=tuple(env.get("turn_kinds") or KINDS),
            confidence_feature=bool(env.get("confidence_feature", False)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"{ckpt / 'config.yaml'}: bad env/policy section: {type(e).__name__}: {e}") from None
    policy = JointPolicy(pcfg)
    load_actors(policy, _load_tensors(ckpt / "model.safetensors"),
                f"{ckpt / 'model.safetensors'}: {{part}} weights do not fit a policy with n_agents={pcfg.n_agents} "
                f"(is the V of {ckpt / 'config.yaml'} right?)")
    spec = llm.get("spec") or llm.get("preset", "")
    synthetic = is_synthetic(spec)  # a spec or a preset name (sim)
    encoder = env.get("encoder") or ("hashing" if synthetic else "minilm")
    state = {}
    if (ckpt / "state.json").exists():
        try:
            state = read_json(ckpt / "state.json", "checkpoint state")
        except IntegrityError as e:
            raise ExportError(str(e)) from None
    training = {"checkpoint": str(ckpt), "iteration": state.get("counters", {}).get("iteration"),
                "task": env.get("task"), "split": env.get("split"), "llm": spec, "synthetic": synthetic,
                "n_rounds": env.get("n_rounds"), "token_cost": env.get("token_cost"),
                "layout": env.get("layout"),  # None: a run from before the layout setting
                "silent": bool(env.get("silent", False)), "answer_aware": float(env.get("answer_aware", 0.0)),
                "decision": env.get("decision", "last-round"),
                **({"vote_tau": float(env.get("vote_tau", DebateConfig.vote_tau))}
                   if env.get("decision") == "confidence-weighted" else {}),
                "start_width": env.get("start_width"),  # None: every agent answers in round 0
                "max_samples": env.get("max_samples"), "fresh_per_round": env.get("fresh_per_round"),
                "sim_params": _sim_params_setting(llm) if synthetic else None}
    return export_policy(policy, out_dir, encoder, training, force=force)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dear.export", description="Export a trained DEAR policy.")
    p.add_argument("checkpoint", help="run directory (uses its latest checkpoint) or a checkpoint directory")
    p.add_argument("out_dir")
    p.add_argument("--force", action="store_true", help="write into a non-empty OUT_DIR (replaces its export)")
    args = p.parse_args(argv)
    out = export_checkpoint(args.checkpoint, args.out_dir, force=args.force)  # an ExportError is a user error
    m = json.loads((out / MANIFEST_FILE).read_text())
    print(f"exported V={m['n_agents']} encoder={m['encoder']} synthetic={m['training'].get('synthetic')} -> {out}")
    return 0


if __name__ == "__main__":
    run_cli(main, "python -m dear.export")
