"""Restore-to-progress under real link cuts: link restored → first update committed after the
in-memory recovery, on 2 emulated nodes (network namespaces, 2 ranks each, FSDP2 HSDP, gloo).
Goal: under 0.5 s.

One job, N cuts aligned to committed boundaries, each restored a different time after the
failure was detected (the stalled control-plane all-reduce then waits on TCP's retransmission
backoff, whose phase the restore time samples). Every cut is split into

  link wait   restore → the stalled control-plane boundary check returned on every rank (TCP RTO)
  repair      the six-phase protocol (slowest rank)
  resume      restore → every rank released (link wait + repair)
  first update   released → the next update committed on every rank

    python bench/chaos.py [--cuts 5] [--data-timeout 2] [--control-timeout 5]

Needs root (network namespaces). Writes bench/results/chaos.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _common import median, table, write_json

from accelpact.chaos.campaign import Scenario, length_classes, run_scenario
from accelpact.chaos.job import JobSpec
from accelpact.chaos.nemesis import Cut, CutMethod
from accelpact.chaos.topology import ChaosUnavailable, preflight


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cuts", type=int, default=5)
    p.add_argument("--data-timeout", type=float, default=2.0)
    p.add_argument("--control-timeout", type=float, default=5.0)
    p.add_argument("--dwell", type=float, default=0.4)
    p.add_argument("--method", default="port-block", choices=[m.value for m in CutMethod])
    p.add_argument("--out", default=None, help="keep the run here (default: a temporary directory)")
    args = p.parse_args()
    try:
        preflight()
    except ChaosUnavailable as exc:
        print(f"bench/chaos.py: {exc}", file=sys.stderr)
        return 2
    base = JobSpec(data_timeout_s=args.data_timeout, control_timeout_s=args.control_timeout, dwell_s=args.dwell,
                   checkpoint_every=0, reference=True, run_id="chaos-bench", rdzv_port=29461)
    detect = length_classes(base)["medium"] - 0.2  # cut → detection, by construction of the dwell
    extra = [0.1, 0.35, 0.7, 1.2, 1.8, 0.2, 0.5, 0.9][: args.cuts]
    cuts = tuple(Cut(CutMethod(args.method), round(detect + e, 2), 5 + 4 * i) for i, e in enumerate(extra))
    job = JobSpec(**{**base.__dict__, "updates": cuts[-1].update + 3,
                     "dwell_updates": tuple(c.update for c in cuts)})
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="accelpact-chaos-bench-"))
    report = run_scenario(Scenario("bench", job, cuts, timeout_s=240, expect="preserve every cut"), out)
    rows, recs = [], []
    for c in report.cuts:
        first = (c.restore_to_progress_s - c.resume_s) if None not in (c.restore_to_progress_s, c.resume_s) else None
        recs.append({"length_s": c.length_s, "after_detection_s": c.length_s - detect, "outcome": c.outcome,
                     "detect_s": c.detect_s, "link_wait_s": c.link_wait_s, "repair_s": c.repair_s,
                     "resume_s": c.resume_s, "first_update_s": first,
                     "restore_to_progress_s": c.restore_to_progress_s})
        rows.append([f"{c.length_s:.2f}", f"{c.length_s - detect:+.2f}", c.outcome] + [
            "-" if v is None else f"{v:.3f}" for v in (c.detect_s, c.link_wait_s, c.repair_s, c.resume_s, first,
                                                        c.restore_to_progress_s)])
    print(table(["cut s", "after detect", "outcome", "detect", "link wait", "repair", "resume", "first update",
                 "restore→progress"], rows))
    good = [r["restore_to_progress_s"] for r in recs if r["outcome"] == "preserve" and r["restore_to_progress_s"]]
    print(f"\nrestore→progress (Preserve): median {median(good):.3f}s over {len(good)} cuts, goal < 0.5s; "
          f"bitwise {report.bitwise}; traces in {report.trace_dir}")
    path = write_json("chaos", {"method": args.method, "data_timeout_s": args.data_timeout,
                                "control_timeout_s": args.control_timeout, "cuts": recs,
                                "median_restore_to_progress_s": median(good), "bitwise": report.bitwise,
                                "trace_dir": report.trace_dir})
    print(f"wrote {path}")
    return 0 if report.bitwise == "IDENTICAL" and good else 1


if __name__ == "__main__":
    sys.exit(main())
