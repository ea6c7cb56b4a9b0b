"""Finished work of an unfinished iteration, kept on disk so that a stop loses no finished debate.

    RUN_DIR/partial/iter_XXXXXX/chunk_YYYY.pt            one file per finished chunk (torch.save of plain data)
    RUN_DIR/partial/iter_XXXXXX/chunk_YYYY.calls.jsonl   the model calls of a chunk still running (`CallLog`)

A chunk's file is written atomically (temporary file + rename) as soon as the chunk finishes. It records the
chunk's spec and a *rollout key*: the sha256 of the policy weights the chunk ran under and of the config sections
that shape a rollout. `--resume` reuses a file only when both match the chunk it would collect, so a reused chunk
is exactly the chunk a new collection would produce (chunks are seeded by (run seed, iteration, chunk index)) and
a resumed run stays bit-identical to an uninterrupted one on the sim backend. A chunk with a failed debate is not
kept: after a stop it is collected again, which retries the backend. The iteration's directory is removed once
its update is done.

A chunk still running when the run stops leaves the log of its model calls that returned (train/call_log.py);
`--resume` replays them, so the debates of that chunk that had finished, and the calls of those that had not,
cost nothing the second time. A chunk's log is removed once the chunk's own file is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from train.buffer import RolloutBatch
from train.call_log import CallLogSpec, read_call_log
from train.config import TrainConfig
from train.workers import ChunkResult, ChunkSpec, EpisodeStats

PARTIAL_DIR = "partial"


def rollout_key(cfg: TrainConfig, weights: dict[str, torch.Tensor]) -> str:
    """sha256 of the rollout weights and of every config value that changes what a chunk collects."""
    h = hashlib.sha256()
    # llm.threads (the llama.cpp thread count) is left out: recorded in config.yaml by later runs, it would
    # otherwise change the key of chunks an older run kept, and a kept chunk is a valid sample at any count.
    llm = {k: v for k, v in cfg.to_dict()["llm"].items() if k != "threads"}
    shaping = {"seed": cfg.run.seed, "llm": llm, "env": cfg.to_dict()["env"],
               "policy": cfg.to_dict()["policy"], "envs_per_worker": cfg.rollout.envs_per_worker}
    if cfg.rollout.group_size != 1:  # other env seeds; left out at 1 so that older partial chunks keep their keys
        shaping["group_size"] = cfg.rollout.group_size
    h.update(json.dumps(shaping, sort_keys=True, default=str).encode())
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _to_plain(result: ChunkResult, key: str) -> dict:
    spec = dataclasses.asdict(result.spec)
    spec["env_seeds"] = list(spec["env_seeds"])
    return {"key": key, "spec": spec,
            "batch": {f.name: getattr(result.batch, f.name) for f in dataclasses.fields(RolloutBatch)},
            "episodes": [dataclasses.asdict(e) for e in result.episodes],
            "env_time_s": float(result.env_time_s), "llm_time_s": float(result.llm_time_s)}


def _from_plain(data: dict) -> ChunkResult:
    spec = dict(data["spec"])
    spec["env_seeds"] = tuple(spec["env_seeds"])
    return ChunkResult(spec=ChunkSpec(**spec), batch=RolloutBatch(**data["batch"]),
                       episodes=[EpisodeStats(**e) for e in data["episodes"]],
                       env_time_s=float(data["env_time_s"]), llm_time_s=float(data["llm_time_s"]))


class PartialIteration:
    """The finished chunks of iteration `iteration` under rollout key `key` (see the module docstring)."""

    def __init__(self, run_dir: Path, iteration: int, key: str):
        self.path = Path(run_dir) / PARTIAL_DIR / f"iter_{iteration:06d}"
        self.key = key

    def _file(self, index: int) -> Path:
        return self.path / f"chunk_{index:04d}.pt"

    def calls_file(self, index: int) -> Path:
        """The call log of chunk `index` while it runs (`CallLog`)."""
        return self.path / f"chunk_{index:04d}.calls.jsonl"

    def save(self, result: ChunkResult) -> None:
        """Keep a finished chunk (atomically); chunks with a failed debate are left to be collected again (their
        call log stays: the calls that succeeded are replayed, the failed ones retried)."""
        if any(e.failed for e in result.episodes):
            return
        self.path.mkdir(parents=True, exist_ok=True)
        final = self._file(result.spec.index)
        tmp = final.with_name(f".{final.name}.tmp")
        torch.save(_to_plain(result, self.key), tmp)
        os.replace(tmp, final)
        self.calls_file(result.spec.index).unlink(missing_ok=True)  # the whole chunk is kept now

    def load(self, chunks: list[ChunkSpec]) -> dict[int, ChunkResult]:
        """Saved chunks that match `chunks` and this key, by chunk index. An unreadable file is named in a
        warning and collected again (a chunk is cheap to redo compared with a wrong batch)."""
        found: dict[int, ChunkResult] = {}
        if not self.path.is_dir():
            return found
        for spec in chunks:
            path = self._file(spec.index)
            if not path.exists():
                continue
            try:
                data = torch.load(path, weights_only=True)
                key, result = data["key"], _from_plain(data)
            except Exception as e:  # noqa: BLE001 - any damage means: do not trust it, redo the chunk
                print(f"warning: {path}: cannot read this saved chunk ({type(e).__name__}: {e}); collecting it "
                      f"again", file=sys.stderr)
                continue
            if key == self.key and result.spec == spec:
                found[spec.index] = result
        return found

    def kept(self, chunks: list[ChunkSpec]) -> KeptWork:
        """What a `--resume` would reuse of this iteration: the debates of its finished chunks and the logged
        calls of its other chunks (under this key)."""
        finished = self.load(chunks)
        calls = tokens = 0
        for spec in chunks:
            if spec.index in finished:
                continue
            for completion in read_call_log(self.calls_file(spec.index), self.key).values():
                calls += len(completion)
                tokens += sum(c.completion_tokens for c in completion)
        return KeptWork(debates=sum(len(r.episodes) for r in finished.values()), chunks=len(finished),
                        calls=calls, tokens=tokens, path=self.path)

    def clear(self) -> None:
        if self.path.exists():
            shutil.rmtree(self.path)
        parent = self.path.parent
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


@dataclass(frozen=True)
class KeptWork:
    """What an interrupted iteration left for `--resume`: finished debates (in whole chunks) and logged calls
    of the debates that had not finished."""

    debates: int
    chunks: int
    calls: int
    tokens: int  # completion tokens of the logged calls
    path: Path

    @property
    def empty(self) -> bool:
        return self.debates == 0 and self.calls == 0


def call_log_spec(partial: PartialIteration) -> CallLogSpec:
    return CallLogSpec(directory=str(partial.path.resolve()), key=partial.key, host=os.uname().nodename)
