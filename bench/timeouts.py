"""Spurious timeouts against time to detect: hand-picked timeouts (data 10 s / control 30 s) vs
timeouts derived at attach (`Config(data_timeout_s="auto", control_timeout_s="auto")`).

For each load and arm, one 4-rank FSDP2 HSDP world (2 nodes x 2 ranks, gloo) trains U updates with
no fault, then takes K real faults (a rank skips the boundary health check: `skip@u:committed:r`;
its peers wait out the data timeout):

- spurious: recoveries at updates where no fault was injected, per 1,000 updates (goal 0);
- MTTD: mean over the faults of the time until every rank knows (the slowest rank's `detect_s`:
  arrival at the boundary to the end of the boundary check), goal: below the hand-picked arm's.

Loads: "quiet" (whatever else runs here) and "loaded" (one busy-loop process per core beside the 4
ranks). The 1-minute load average is printed beside each figure; the derived arm derives under the
same load it then runs in.

    python bench/timeouts.py [--updates 1000] [--faults 2] [--loads quiet,loaded]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import table, write_json

from accelpact.testing.spawn import run_world

ARMS = {"hand-picked": (10.0, 30.0), "derived": ("auto", "auto")}


def worker(rank: int, world: int, data_s, control_s, updates: int, clean: int, plan: str) -> dict:
    import accelpact
    from accelpact.workloads import build_hsdp_job, next_token_loss

    model, opt, data = build_hsdp_job("fsdp2", layers=2, dim=32, seed=1, seq_len=8, batch_size=2)
    config = accelpact.Config(data_timeout_s=data_s, control_timeout_s=control_s, on_reject="raise",
                              envelope="builtin")
    t = time.perf_counter()
    rt = accelpact.attach(model, opt, data_state=data, config=config, faults=plan)
    attach_s = time.perf_counter() - t

    def update():
        next_token_loss(model, data.next_batch()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = time.perf_counter()
    for i in range(updates):
        rt.step(update)
        if i + 1 == clean:
            clean_s = time.perf_counter() - t
    out = {"rank": rank, "config": (rt.config.data_timeout_s, rt.config.control_timeout_s),
           "why": rt.timeouts.describe() if rt.timeouts else "given", "attach_s": attach_s,
           "clean_s": clean_s, "history": [h.to_dict() for h in rt.history]}
    rt.close()
    return out


def burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_arm(arm: str, updates: int, faults: int) -> dict:
    fault_updates = [updates + 2 + 2 * i for i in range(faults)]
    plan = ",".join(f"skip@{u}:committed:{(1 + 2 * i) % 4}" for i, u in enumerate(fault_updates))
    total = (fault_updates[-1] + 1) if faults else updates
    data_s, control_s = ARMS[arm]
    results = run_world(worker, 4, data_s, control_s, total, updates, plan, timeout_s=3600, pg_timeout_s=60)
    recoveries: dict[int, list[dict]] = {}
    for r in results:
        for h in r["history"]:
            recoveries.setdefault(h["update"], []).append(h)
    spurious = sorted(u for u in recoveries if u not in fault_updates)
    detect = [max(h["detect_s"] for h in recoveries[u]) for u in fault_updates if u in recoveries]
    return {"arm": arm, "config": results[0]["config"], "why": results[0]["why"], "updates": total,
            "spurious": len(spurious), "spurious_at": spurious, "per_1000": 1000 * len(spurious) / total,
            "faults": faults, "detected": len(detect), "mttd_s": sum(detect) / len(detect) if detect else None,
            "update_ms": 1e3 * max(r["clean_s"] for r in results) / updates, "load1": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=1000, help="fault-free updates per arm and load")
    ap.add_argument("--faults", type=int, default=2, help="real faults per arm and load, after the clean run")
    ap.add_argument("--loads", default="quiet,loaded")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="busy loops for 'loaded'")
    args = ap.parse_args(argv)
    rows, out = [], []
    for load in args.loads.split(","):
        procs = burners(args.burners) if load == "loaded" else []
        try:
            for arm in ARMS:
                res = {"load": load, **run_arm(arm, args.updates, args.faults)}
                out.append(res)
                mttd = f"{res['mttd_s']:.2f} s" if res["mttd_s"] is not None else "-"
                rows.append([load, arm, f"{res['config'][0]:g} / {res['config'][1]:g} s",
                             f"{res['spurious']} / {res['updates']}", f"{res['per_1000']:.1f}",
                             f"{mttd} ({res['detected']}/{res['faults']})", f"{res['update_ms']:.0f} ms",
                             f"{res['load1']:.2f}"])
                print(f"  {load:>6} {arm:<11} {res['why']}", flush=True)
        finally:
            for p in procs:  # only the busy loops this bench started
                p.kill()
                p.wait()
    print(f"\nspurious timeouts vs MTTD, 4 ranks FSDP2 HSDP 2x2 (gloo), {args.updates} clean updates + "
          f"{args.faults} faults per arm")
    print(table(["load", "arm", "data / control", "spurious", "per 1000", "MTTD (detected)", "update",
                 "load avg 1m"], rows))
    by = {(r["load"], r["arm"]): r for r in out}
    for load in args.loads.split(","):
        hand, auto = by.get((load, "hand-picked")), by.get((load, "derived"))
        if hand and auto and hand["mttd_s"] and auto["mttd_s"]:
            print(f"{load}: derived MTTD is {hand['mttd_s'] / auto['mttd_s']:.1f}x lower; spurious per 1000 "
                  f"{auto['per_1000']:.1f} (derived) vs {hand['per_1000']:.1f} (hand-picked)")
    path = write_json("timeouts", {"args": vars(args), "arms": out})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
