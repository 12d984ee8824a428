"""Helpers shared by the benches: results directory, medians, table printing."""

from __future__ import annotations

import json
import statistics
import sys
import time
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


class TimedUpdate:
    """One plain update (forward, backward, step, zero_grad) of a `build_hsdp_job` job, whose
    thread CPU accumulates in `cpu_s`: the user's code, subtracted from an arm's thread CPU to
    leave AccelPact's own (`bench/guard.py`, `bench/deferred_check.py`)."""

    def __init__(self, model, opt, data):
        self.model, self.opt, self.data, self.cpu_s = model, opt, data, 0.0

    def __call__(self) -> None:
        from accelpact.workloads import next_token_loss

        t = time.thread_time()
        loss = next_token_loss(self.model, self.data.next_batch())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.cpu_s += time.thread_time() - t


def model_size(text: str) -> tuple[int, int]:
    """argparse type for a decoder size written DIMxLAYERS, e.g. 128x4."""
    try:
        dim, layers = text.lower().split("x")
        return int(dim), int(layers)
    except ValueError:
        raise ValueError(f"a size is DIMxLAYERS, e.g. 128x4; got {text!r}") from None
