"""Order statistics shared by the timeout derivation and the straggler signal. Pure.

Nearest-rank quantiles, never interpolated: a derived bound is then always an observed value, so a
timeout cannot be set below something that actually happened among the samples."""

from __future__ import annotations

import math
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-quantile of `values` (q in (0, 1]; 1 is the maximum)."""
    if not 0 < q <= 1:
        raise ValueError(f"a quantile must be in (0, 1], got {q!r}")
    if not values:
        raise ValueError("a quantile of no samples is undefined")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
