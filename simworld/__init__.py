"""The simulated world's application (floor 4, beside `eval/` and `train/`): collect real debates, fit the
simulator (`dear.sim`) to them, and make its observations look like real ones.

- `simworld.corpus`: `python -m simworld.corpus`, the resumable logged-debate corpus (logging policy + MAD).
- `simworld.fit`: `python -m simworld.fit`, maximum-likelihood fit of every sim parameter on a corpus
  (`simworld.mle`), validated on held-out questions (`simworld.validation`, `simworld.rates`).
- `simworld.bank_fit`: `python -m simworld.bank_fit`, the independent samples (round 0, fresh samples) refitted to a
  sample bank, validated on held-out train questions; `simworld.confidence_fit`, the confidence model alone.
- `simworld.evidence_match`: `python -m simworld.evidence_match`, the real-text bank and its recombination fitted
  to real e_ij.
- `simworld.map_fit`: `python -m simworld.map_fit`, the first (MAP) fit on a trace file, superseded by
  `simworld.fit`; kept because `results/sim_fit/` was made by it. `simworld.replay`: the sim replayed on logged
  schedules.

A fitted world that training reads is copied to `worlds/` (see `worlds/*/README.md`); `results/` keeps the
fit's outputs."""
