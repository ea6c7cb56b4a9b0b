"""A sample bank: the model's real independent samples (round-0 answers), stored so that a world can replay them.

A bank is a directory for one model file. It holds one *shelf* per sampling setting, a gzip JSON-lines file of
samples, and `MANIFEST.json`: the model file and its sha256, each shelf's key (benchmark, split, agent profile,
temperature, top-p, token limit, log-probability alternatives), its questions and samples, and its file's sha256.

A sample is one completion of a question's round-0 prompt at the shelf's setting: its index `sample` (0, 1, ...)
fixes its seed, the seed round-0 agent `sample` of the question's debate gets (dear.debate.engine), so sample i of
a bank equals agent i's answer in a round 0 of the same question, and a bank draw of a stored sample is exact. A
question built with a shared prompt read (`dear.bank build --shared-prompt`) numbers its samples from one seed
instead (sample i: sample 0's seed + i); the manifest counts such questions (`shared_prompt_questions`), since its
`generation` holds only the latest build's settings.
Each keeps its text, answer, key, grade, tokens, finish reason, seed and confidence record (dear/confidence.py); a
program-of-thought (`pot`) sample also keeps its program's sandbox run, so a replay reads the answer it was graded by
and never runs the program again.

Shelves grow by appending one gzip member per question, flushed and fsynced, so a stopped build keeps every
question it finished; the manifest is rewritten atomically after each append (re-read under a lock, so builds of
different shelves may run at once) and `verify()` checks the checksums.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dear.atomic import write_json

MANIFEST = "MANIFEST.json"
MANIFEST_LOCK = ".MANIFEST.lock"  # held while a process rewrites the manifest (several builds may share a bank)
FORMAT = "dear-sample-bank/1"


@dataclass(frozen=True)
class ShelfKey:
    """What a sample was drawn under (the model is the bank's)."""

    benchmark: str
    split: str
    profile: str  # the agent's reply style, e.g. "cot"
    temperature: float
    top_p: float
    max_tokens: int

    @property
    def name(self) -> str:
        """The shelf's file stem, e.g. gsm8k-test-cot-t0.7-p0.9-m384."""
        return (f"{self.benchmark}-{self.split}-{self.profile}-t{self.temperature:g}-p{self.top_p:g}"
                f"-m{self.max_tokens}")


@dataclass(frozen=True)
class BankSample:
    """One stored completion (module docstring)."""

    question_id: str
    sample: int
    seed: int
    text: str
    answer: str | None
    answer_key: str | None
    correct: bool
    grader: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    confidence: dict[str, Any] | None = None
    latency_s: float = 0.0
    program: dict[str, Any] | None = None  # a `pot` sample's sandbox run (dear.debate.pot.PotRun.to_dict()) it was graded by

    def to_dict(self) -> dict[str, Any]:
        """The stored form (`program` only on `pot` samples, so other shelves keep their bytes)."""
        d = asdict(self)
        if d["program"] is None:
            del d["program"]
        return d

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "") -> BankSample:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"{where}: unknown sample keys {sorted(unknown)}")
        return cls(**d)


@dataclass
class Shelf:
    """One setting's samples, by question then sample index."""

    key: ShelfKey
    path: Path
    samples: dict[str, dict[int, BankSample]] = field(default_factory=lambda: defaultdict(dict))

    @property
    def questions(self) -> list[str]:
        return list(self.samples)

    def n_samples(self, question_id: str) -> int:
        return len(self.samples.get(question_id, {}))

    def of(self, question_id: str) -> list[BankSample]:
        """The question's samples in index order (empty when it has none)."""
        return [s for _, s in sorted(self.samples.get(question_id, {}).items())]

    def shares_one_prompt(self, question_id: str) -> bool:
        """Whether the question's samples were numbered from one seed (sample i: sample 0's seed + i), as a build
        with a shared prompt read numbers them (`DebateConfig.shared_prompt`); a question of one sample is not."""
        samples = self.of(question_id)
        return len(samples) > 1 and all(s.seed is not None and samples[0].seed is not None
                                        and s.seed == samples[0].seed + s.sample for s in samples)

    def load(self) -> Shelf:
        if not self.path.exists():
            return self
        with gzip.open(self.path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        s = BankSample.from_dict(json.loads(line), f"{self.path}:{lineno}")
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{self.path}:{lineno}: not JSON ({e}); the shelf is damaged") from None
                    self.samples[s.question_id][s.sample] = s
        return self

    def append(self, samples: Sequence[BankSample]) -> None:
        """Add samples as one gzip member, flushed to disk (a stop after this keeps them)."""
        new = [s for s in samples if s.sample not in self.samples.get(s.question_id, {})]
        if not new:
            return
        blob = "".join(json.dumps(s.to_dict(), ensure_ascii=False) + "\n" for s in new).encode("utf-8")
        with open(self.path, "ab") as f:
            f.write(gzip.compress(blob, mtime=0))
            f.flush()
            os.fsync(f.fileno())
        for s in new:
            self.samples[s.question_id][s.sample] = s


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Bank:
    """A bank directory (module docstring). `Bank.open(dir, model_file, model_sha256)` creates or continues one;
    a bank of another model file refuses to open."""

    def __init__(self, root: Path, manifest: dict[str, Any]):
        self.root = root
        self.manifest = manifest
        self._shelves: dict[ShelfKey, Shelf] = {}

    @classmethod
    def open(cls, root: str | Path, model_file: str | None = None, model_sha256: str | None = None) -> Bank:
        root = Path(root)
        path = root / MANIFEST
        if path.exists():
            manifest = json.loads(path.read_text(encoding="utf-8"))
            if manifest.get("format") != FORMAT:
                raise ValueError(f"{path}: not a sample bank of format {FORMAT!r} (format {manifest.get('format')!r})")
            if model_sha256 is not None and manifest["model_sha256"] != model_sha256:
                raise ValueError(f"{root}: a bank of model {manifest['model_file']} (sha256 "
                                 f"{manifest['model_sha256'][:12]}…), not of {model_file} ({model_sha256[:12]}…); "
                                 f"choose another --bank")
            return cls(root, manifest)
        if model_sha256 is None:
            raise FileNotFoundError(f"{root}: no sample bank here (no {MANIFEST})")
        root.mkdir(parents=True, exist_ok=True)
        bank = cls(root, {"format": FORMAT, "model_file": model_file, "model_sha256": model_sha256, "shelves": {}})
        bank.write_manifest()
        return bank

    @property
    def keys(self) -> list[ShelfKey]:
        return [ShelfKey(**entry["key"]) for entry in self.manifest["shelves"].values()]

    def shelf(self, key: ShelfKey) -> Shelf:
        if key not in self._shelves:
            self._shelves[key] = Shelf(key, self.root / f"{key.name}.jsonl.gz").load()
        return self._shelves[key]

    def record(self, shelf: Shelf, settings: dict[str, Any]) -> None:
        """Update the shelf's manifest entry (counts, checksum, the settings of the latest build, and how many
        questions share one prompt read). The manifest is read again under a lock first, so builds of other shelves in
        other processes keep their entries."""
        with open(self.root / MANIFEST_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / MANIFEST
            if path.exists():
                self.manifest = json.loads(path.read_text(encoding="utf-8"))
            entry = self.manifest["shelves"].setdefault(shelf.key.name, {"key": asdict(shelf.key)})
            entry.update(questions=len(shelf.samples), samples=sum(len(v) for v in shelf.samples.values()),
                         file=shelf.path.name, sha256=sha256_of(shelf.path), bytes=shelf.path.stat().st_size,
                         generation=settings,
                         shared_prompt_questions=sum(shelf.shares_one_prompt(q) for q in shelf.questions))
            self.write_manifest()

    def write_manifest(self) -> None:
        write_json(self.root / MANIFEST, self.manifest)

    def verify(self) -> list[str]:
        """Shelves whose file is missing or differs from its recorded checksum (empty: all intact)."""
        bad = []
        for name, entry in self.manifest["shelves"].items():
            path = self.root / entry["file"]
            if not path.exists() or sha256_of(path) != entry["sha256"]:
                bad.append(name)
        return bad


def group_by_question(samples: Iterable[BankSample]) -> dict[str, list[BankSample]]:
    out: dict[str, list[BankSample]] = defaultdict(list)
    for s in samples:
        out[s.question_id].append(s)
    return {q: sorted(v, key=lambda s: s.sample) for q, v in out.items()}


def shown_path(path: Path) -> str:
    """A bank directory as reports show it: relative to the working directory when inside it (a checkout's
    committed bank reads the same on every machine), else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
