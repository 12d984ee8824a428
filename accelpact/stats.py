"""Order statistics shared by the timeout derivation and the straggler signal. Pure.

Nearest-rank quantiles, never interpolated: a derived bound is then always an observed value, so a
timeout cannot be set below something that actually happened among the samples."""

from __future__ import annotations

import math
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-quantile of `values` (q in (0, 1]; 1 is the maximum)."""
    if not values:
        raise ValueError("a quantile of no samples is undefined")
    return sorted(values)[nearest_rank(len(values), q)]


def nearest_rank(n: int, q: float) -> int:
    """The index, in `n` sorted samples, of their nearest-rank `q`-quantile (q in (0, 1])."""
    if not 0 < q <= 1:
        raise ValueError(f"a quantile must be in (0, 1], got {q!r}")
    return max(0, math.ceil(q * n) - 1)
