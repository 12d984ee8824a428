"""Helpers shared by the benches: results directory, medians, table printing."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def model_size(text: str) -> tuple[int, int]:
    """argparse type for a decoder size written DIMxLAYERS, e.g. 128x4."""
    try:
        dim, layers = text.lower().split("x")
        return int(dim), int(layers)
    except ValueError:
        raise ValueError(f"a size is DIMxLAYERS, e.g. 128x4; got {text!r}") from None
