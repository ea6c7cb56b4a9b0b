"""The one seed-derivation rule: a seed from a tuple of integers (run seed, iteration, chunk, purpose tag, ...),
stable across processes and platforms. Used by the debate engine, protocols, interventions, training and eval."""

from __future__ import annotations

import numpy as np


def derive_seed(*parts: int, bits: int = 31) -> int:
    """A non-negative `bits`-bit seed (31 or 62) from integers; each part is taken modulo 2**32.

    31 bits fits every RNG API (llama.cpp, numpy, torch); 62 bits is what training uses for its torch generators
    and chunk RNGs (kept so existing runs reproduce). Both come from the same SeedSequence."""
    entropy = [int(p) & 0xFFFFFFFF for p in parts]
    if bits == 31:
        return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)
    if bits == 62:
        return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> np.uint64(2))
    raise ValueError(f"derive_seed: bits must be 31 or 62, got {bits}")
