"""What replica digest agreement (`Config.digest_every`) costs, on the tiny FSDP2 HSDP job.

One 4-rank world (HSDP 2x2: two holders per shard) trains the same model throughout:

- per check: `rt.digests.after_commit` called directly at a due frontier, `--checks` times:
  the pack + SHA-256 of the rank's shard (parameters, buffers, optimizer state) and the one
  control-plane gather of the digests (the replicas agree, as they do when nothing is corrupt);
- per update: `rt.step(fn)` in phases of `--updates` updates with the check off, then every
  K = 1, 10, 100 commits, and back (`--rounds` passes, alternating order); the cost is the mean update time of the phase minus the "off" phase
  (a mean, since one update in K pays the whole check), beside the per-check median / K.

Every figure carries the 1-minute load average read when it was measured: on an oversubscribed
machine (more ranks than cores) the gather waits for descheduled peers.

    python bench/digests.py [--updates 200] [--rounds 2] [--checks 30] [--nproc 4] [--dim 32] [--layers 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import median, table, write_json

from accelpact.testing.spawn import run_world

EVERY = (1, 10, 100)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def worker(rank: int, world: int, updates: int, rounds: int, checks: int, dim: int, layers: int) -> dict:
    import accelpact
    from accelpact.membership import transfer
    from accelpact.workloads import build_hsdp_job, next_token_loss

    model, opt, data = build_hsdp_job("fsdp2", layers=layers, dim=dim, seed=1, seq_len=16, batch_size=4)
    rt = accelpact.attach(model, opt, data_state=data, config=accelpact.Config(
        data_timeout_s=10, control_timeout_s=60, envelope="permissive", digest_every=1))

    def update() -> None:
        next_token_loss(model, data.next_batch()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up: optimizer state exists, the check has run once
        rt.step(update)
    out: dict = {"rank": rank}
    per_check, digest_s = [], []
    load = load1()
    for _ in range(checks):
        t = time.perf_counter()
        rt.digests.after_commit(rt)
        per_check.append(time.perf_counter() - t)
        digest_s.append(rt.digests.checks[-1].digest_s)
    out["check"] = {"median_s": median(per_check), "digest_median_s": median(digest_s), "load": [load, load1()],
                    "outcomes": sorted({c.outcome for c in rt.digests.checks})}
    out["bytes"] = int(transfer.pack(model, opt).numel())
    digests, phases = rt.digests, {}
    order = (0, *EVERY)
    for n in range(rounds):  # forth and back, so that a drifting load hits every arm alike
        for every in order if n % 2 == 0 else order[::-1]:
            rt.digests = digests if every else None
            digests.every = every
            load, times, ran = load1(), [], len(digests.checks)
            for _ in range(updates):
                t = time.perf_counter()
                rt.step(update)
                times.append(time.perf_counter() - t)
            phase = phases.setdefault(str(every), {"times": [], "checks": 0, "load": []})
            phase["times"] += times
            phase["checks"] += len(digests.checks) - ran
            phase["load"] += [load, load1()]
    for phase in phases.values():
        times = phase.pop("times")
        phase.update(mean_s=statistics.fmean(times), median_s=median(times))
    out["phases"] = phases
    rt.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=200, help="updates per phase (off, K=1, 10, 100)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the phases, alternating their order")
    ap.add_argument("--checks", type=int, default=30, help="direct checks for the per-check cost")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    results = run_world(worker, args.nproc, args.updates, args.rounds, args.checks, args.dim, args.layers, timeout_s=1800,
                        pg_timeout_s=120)
    r0 = results[0]
    check = max(r["check"]["median_s"] for r in results)  # the gather ends when the slowest rank arrives
    digest = max(r["check"]["digest_median_s"] for r in results)
    print(f"tiny FSDP2 HSDP {args.nproc // 2}x2, dim {args.dim} x {args.layers} layers: "
          f"{r0['bytes'] / 1e3:.1f} kB of shard state per rank; cores: {os.cpu_count()}")
    print(f"per check: {check * 1e3:.2f} ms (pack + SHA-256: {digest * 1e3:.2f} ms, the rest: the gather); "
          f"outcomes {r0['check']['outcomes']}; load {r0['check']['load']}")
    off = statistics.fmean(r["phases"]["0"]["mean_s"] for r in results)
    rows = [["off", "-", f"{off * 1e3:.2f}", "-", "-", r0["phases"]["0"]["load"]]]
    for every in EVERY:
        key = str(every)
        mean = statistics.fmean(r["phases"][key]["mean_s"] for r in results)
        rows.append([f"K={every}", r0["phases"][key]["checks"], f"{mean * 1e3:.2f}", f"{(mean - off) * 1e3:+.3f}",
                     f"{check / every * 1e3:.3f}", r0["phases"][key]["load"]])
    print(table(["digest_every", "checks", "update ms (mean)", "measured added ms", "check / K ms",
                 "load 1m (before, after each phase)"], rows))
    path = write_json("digests", {"args": vars(args), "results": results})
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
