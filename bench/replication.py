"""What neighbour-memory replication (`Config.replicate="neighbour"`) costs a fully sharded job.

For each size of per-rank shard state (parameters + Adam's two moments; 1, 10 and 100 MB by
default) one job is launched as production would (W active ranks and a spare, FSDP2
`fully_shard` over every rank, `rt.step`), and inside that one job the copy is switched on and
off in alternating blocks of `--updates` updates (`rt.neighbours.sends`), so both arms share the
processes, the model, the caches and the machine's load of the moment. Per arm: the median
update time; per copy: the bytes, and where its time went on the sender's thread (pack, SHA-256,
network) against what the training thread waited for it in the next optimizer pre-hook.
"hidden" is the share of the sender's work that did not show in the update time: the added
time counts the waits and the CPU the sender took from the ranks' compute.

The 1-minute load average is printed beside each size: on 2 shared cores the sender's hashing and
the receiver's socket compete with the ranks' compute, which a GPU node's idle host CPUs would
not. Quote a quiet run beside a loaded one.

    python bench/replication.py [--sizes 1 10 100] [--nproc 2] [--updates 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import median, table, write_json

LAYERS = 2


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def shard_bytes(dim: int, world: int) -> int:
    """Parameters and Adam's two fp32 moments of one rank's shard, in bytes."""
    import torch

    from accelpact.workloads import TinyDecoder

    with torch.device("meta"):
        n = sum(p.numel() for p in TinyDecoder(dim=dim, n_layers=LAYERS).parameters())
    return 3 * 4 * n // world


def dim_for(megabytes: float, world: int) -> int:
    lo, hi = 4, 4096  # half the dim: two heads need an even one
    while lo < hi:  # the smallest dim whose shard state reaches the size
        mid = (lo + hi) // 2
        if shard_bytes(2 * mid, world) >= megabytes * 1e6:
            hi = mid
        else:
            lo = mid + 1
    return 2 * lo


def worker(args: argparse.Namespace) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    import accelpact
    from accelpact.workloads import build_hsdp_job, next_token_loss

    torch.set_num_threads(1)
    accelpact.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    model, opt, data = build_hsdp_job("fsdp2-full", layers=LAYERS, dim=args.dim, seed=1, seq_len=16, batch_size=4)
    rt = accelpact.attach(model, opt, data_state=data, config=accelpact.Config(
        data_timeout_s=60, control_timeout_s=120, envelope="permissive", replicate="neighbour"))
    rep = rt.neighbours

    def update() -> None:
        next_token_loss(model, data.next_batch()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up: optimizer state exists, the connection is open
        rt.step(update)
    blocks = []
    for r in range(args.rounds):
        for arm in (("off", "neighbour") if r % 2 == 0 else ("neighbour", "off")):
            rep.wait_packed()
            rep.sends = arm == "neighbour"
            before = {k: getattr(rep, k) for k in ("pack_s", "hash_s", "send_s", "join_wait_s", "sent")}
            load, times = load1(), []
            for _ in range(args.updates):
                t = time.perf_counter()
                rt.step(update)
                times.append(time.perf_counter() - t)
            time.sleep(0.3 if arm == "neighbour" else 0.0)  # the block's last copy lands before it is counted
            delta = {k: getattr(rep, k) - v for k, v in before.items()}
            blocks.append({"arm": arm, "times": times, "load": load, "bytes": rep.bytes, **delta})
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, {"rank": rt.rank, "blocks": blocks, "held": rep.stats()["held"]})
    if rt.rank == 0:
        Path(args.out).write_text(json.dumps(out))
    rt.close()
    dist.destroy_process_group()
    return 0


def summarise(size_mb: float, dim: int, ranks: list[dict]) -> dict:
    arms: dict[str, list[float]] = {"off": [], "neighbour": []}
    work = wait = copies = 0.0
    parts = {"pack_s": 0.0, "hash_s": 0.0, "send_s": 0.0}
    loads, nbytes = [], 0
    for r in ranks:
        for b in r["blocks"]:
            arms[b["arm"]] += b["times"]
            loads.append(b["load"])
            if b["arm"] == "neighbour":
                work += b["pack_s"] + b["hash_s"] + b["send_s"]
                for k in parts:
                    parts[k] += b[k]
                wait += b["join_wait_s"]
                copies += b["sent"]
                nbytes = max(nbytes, b["bytes"])
    off, on = median(arms["off"]), median(arms["neighbour"])
    return {"size_mb": size_mb, "dim": dim, "bytes_per_copy": nbytes, "off_ms": off * 1e3, "neighbour_ms": on * 1e3,
            "ratio": on / off, "added_ms": (on - off) * 1e3, "copy_work_ms": work / max(copies, 1) * 1e3,
            "exposed_ms": wait / max(copies, 1) * 1e3,
            # the share of the sender's work that did not show in the update time (waits and CPU contention)
            "hidden": 1 - max(0.0, on - off) / (work / copies) if work and copies else float("nan"),
            "copies": int(copies), "load": statistics.mean(loads) if loads else float("nan"),
            **{k.replace("_s", "_ms"): v / max(copies, 1) * 1e3 for k, v in parts.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 10, 100], help="MB of shard state per rank")
    parser.add_argument("--nproc", type=int, default=2, help="active ranks (a spare is launched beside them)")
    parser.add_argument("--updates", type=int, default=8, help="updates per block")
    parser.add_argument("--rounds", type=int, default=3, help="blocks per arm (alternating order)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dim", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    from accelpact.testing.spares import launch_with_spares

    rows, results = [], []
    for size in args.sizes:
        dim = dim_for(size, args.nproc)
        with tempfile.TemporaryDirectory(prefix="accelpact-replication-") as tmp:
            out = Path(tmp) / "result.json"
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"--dim={dim}", f"--out={out}",
                   f"--updates={args.updates}", f"--rounds={args.rounds}"]
            codes, output, seconds = launch_with_spares(cmd, active=args.nproc, spares=1, log_dir=Path(tmp),
                                                        timeout_s=1800)
            if not out.exists():
                print(f"{size} MB: the job failed (exit codes {codes})\n" + "\n".join(o[-2000:] for o in output))
                return 1
            s = summarise(size, dim, json.loads(out.read_text()))
        results.append(s)
        rows.append([f"{size:g}", dim, f"{s['bytes_per_copy'] / 1e6:.1f}", f"{s['off_ms']:.1f}",
                     f"{s['neighbour_ms']:.1f}", f"{s['ratio']:.3f}", f"{s['added_ms']:+.1f}",
                     f"{s['copy_work_ms']:.1f} ({s['pack_ms']:.0f}/{s['hash_ms']:.0f}/{s['send_ms']:.0f})",
                     f"{s['exposed_ms']:.2f}", f"{s['hidden']:.1%}", f"{s['load']:.2f}"])
        print(f"  {size:g} MB done in {seconds:.0f} s", flush=True)
    print(f"\nneighbour replication, FSDP2 fully sharded over {args.nproc} ranks (+1 spare), blocks of {args.updates} "
          f"updates x {args.rounds} per arm, alternating, in one job per size")
    print(table(["MB/rank", "dim", "MB/copy", "off ms", "copy ms", "ratio", "added", "copy work ms (pack/hash/net)",
                 "exposed ms", "hidden", "load"], rows))
    print("copy work: the sender's pack + SHA-256 + network per copy (its own thread); exposed: what the training "
          "thread waited for the pack in the next optimizer pre-hook; hidden: 1 - added / copy work")
    path = write_json("replication", {"nproc": args.nproc, "updates": args.updates, "rounds": args.rounds,
                                      "cores": os.cpu_count(), "results": results})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
