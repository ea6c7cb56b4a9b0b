"""Run logging: every scalar to CSV + JSONL in the run dir, optional wandb, and a live progress display.

The progress display (`dear.progress.LiveProgress`) counts the run's debates, redrawn every few seconds with the
tokens generated so far, tokens/s, elapsed time, the debates in flight and an ETA, so it moves while a chunk of
debates is still running. The ETA is counted in tokens (tokens generated / tokens per debate, the expected count
until a debate has finished), so it shows within the first minute instead of after the first chunk. In a bank
world the tokens are the stored samples' (replayed, not generated: the line says so), at the bank's speed.

Synthetic (sim backend) runs are labelled everywhere: each metric name is prefixed `synthetic/`, each
JSONL row carries `"synthetic": true`, and the run directory name contains "synthetic".
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dear.atomic import atomic_write_text
from dear.integrity import IntegrityError
from dear.progress import LiveProgress, ProgressSnapshot

SYNTHETIC_PREFIX = "synthetic/"


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics.jsonl ([] when absent). A damaged last line (a crash mid-write) is dropped with a
    warning; any other unparsable line raises IntegrityError naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            int(row["iteration"])
        except (ValueError, KeyError, TypeError) as e:
            if lineno == len(lines):
                tqdm.write(f"warning: {path}:{lineno}: incomplete last row dropped ({type(e).__name__}: {e})")
                continue
            raise IntegrityError(f"{path}:{lineno}: not a metrics row (damaged?): {type(e).__name__}: {e}") from None
        rows.append(row)
    return rows


class RunLogger:
    """Metrics files and wandb, and the run's progress display over `total_iterations * debates_per_iteration`
    debates; `tokens` reads the tokens generated so far and `replayed` those replayed from a sample bank (the rollout
    pool's counters), `listener` sees every tick of the display."""

    def __init__(self, run_dir: Path, synthetic: bool, total_iterations: int, start_iteration: int = 0,
                 use_wandb: bool = False, wandb_project: str = "dear", config: dict | None = None,
                 progress: bool = True, debates_per_iteration: int = 1, tokens: Callable[[], int] | None = None,
                 listener: Callable[[ProgressSnapshot], None] | None = None,
                 expected_tokens_per_debate: float | None = None, replayed: Callable[[], int] | None = None):
        self.run_dir = Path(run_dir)
        self.synthetic = synthetic
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        self.csv_path = self.run_dir / "metrics.csv"
        self._truncate_after(start_iteration)
        self._columns: list[str] = []
        if self.csv_path.exists():
            with self.csv_path.open() as f:
                self._columns = next(csv.reader(f), [])
        self._wandb = None
        if use_wandb:
            try:
                import wandb  # optional; WANDB_MODE=offline works without network
            except ImportError:
                print("[logger] wandb not installed; logging to CSV/JSONL only")
            else:
                self._wandb = wandb.init(project=wandb_project, dir=str(self.run_dir), config=config,
                                         name=self.run_dir.name, id=self.run_dir.name.replace("/", "_"),
                                         resume="allow")
        self.total_iterations = total_iterations
        self.debates_per_iteration = debates_per_iteration
        self.live = LiveProgress(total=total_iterations * debates_per_iteration,
                                 initial=start_iteration * debates_per_iteration,
                                 desc="synthetic HAPPO" if synthetic else "HAPPO", unit="debate", tokens=tokens,
                                 enabled=progress, listener=listener,
                                 expected_tokens_per_unit=expected_tokens_per_debate, replayed=replayed)
        self.live.set_info(it=f"{start_iteration}/{total_iterations}")

    def name(self, key: str) -> str:
        return SYNTHETIC_PREFIX + key if self.synthetic and not key.startswith(SYNTHETIC_PREFIX) else key

    def _read_rows(self) -> list[dict]:
        return read_metrics(self.jsonl_path)

    def _truncate_after(self, iteration: int) -> None:
        """On resume, drop rows logged after the checkpoint (they will be produced again)."""
        if not self.jsonl_path.exists():
            return
        rows = self._read_rows()
        keep = [r for r in rows if r["iteration"] <= iteration]
        atomic_write_text(self.jsonl_path, "".join(json.dumps(r) + "\n" for r in keep))
        if keep:
            self._rewrite_csv(keep)
        elif self.csv_path.exists():
            self.csv_path.unlink()

    def _rewrite_csv(self, rows: list[dict]) -> None:
        cols: list[str] = []
        for r in rows:
            cols += [k for k in r if k not in cols]
        with self.csv_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        self._columns = cols

    def log(self, iteration: int, global_step: int, scalars: dict[str, float]) -> dict[str, Any]:
        row: dict[str, Any] = {"iteration": iteration, "global_step": global_step, "time": time.time(),
                               "synthetic": self.synthetic}
        row.update({self.name(k): (None if isinstance(v, float) and math.isnan(v) else v)
                    for k, v in scalars.items()})
        with self.jsonl_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if not self._columns or any(k not in self._columns for k in row):
            self._rewrite_csv(self._read_rows())
        else:
            with self.csv_path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerow(row)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=global_step)
        return row

    def progress(self, iteration: int, sps: float, reward: float, accuracy: float) -> None:
        """After `iteration` iterations: the last one's reward, accuracy and env steps per second."""
        self.rollout_progress(iteration, 0)
        self.live.set_info(it=f"{iteration}/{self.total_iterations}", SPS=f"{sps:.2f}", reward=f"{reward:+.3f}",
                           acc=f"{accuracy:.3f}")
        self.live.tick(line=True)

    def rollout_progress(self, iteration: int, debates_done: int) -> None:
        """Inside iteration `iteration` (0-based): `debates_done` of its debates finished so far."""
        done = iteration * self.debates_per_iteration + debates_done
        self.live.update(done - self.live.done)

    def in_flight(self, n: int) -> None:
        """`n` debates running now (shown on the progress line)."""
        self.live.set_in_flight(n)

    def debates_kept(self, n: int) -> None:
        """`n` debates of the current iteration kept from an interrupted run: done, but not in the rate."""
        self.live.skip(n)

    def write(self, msg: str) -> None:
        tqdm.write(("[synthetic] " if self.synthetic else "") + msg)

    def close(self) -> None:
        self.live.close()
        if self._wandb is not None:
            self._wandb.finish()
