"""The demo trainer, one process per rank under torchrun.

It trains a small causal decoder with HSDP 2×2 (FSDP2 by default, FSDP1 or DDP by flag) under
AccelPact with faults injected at committed boundaries, then trains an uninterrupted reference
with the same seed and data in the same processes, and prints a bitwise verdict per rank:
parameters, optimizer state, step, RNG and data cursor.

Everything a user would change in their own trainer is the three marked lines.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import accelpact
from accelpact import state as app_state
from accelpact.config import AUTO
from accelpact.observe.incident import nobody_lost
from accelpact.workloads import (
    FRAMEWORKS,
    HSDPLayout,
    add_running_stat,
    build_hsdp_job,
    seed_everything,
    stochastic_update,
)

DEFAULT_FAULTS = "skip@8:committed:2,late@18:committed:1,skip@28:committed:0"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="accelpact-demo-worker")
    p.add_argument("--framework", choices=FRAMEWORKS, default="fsdp2")
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=32, help="model width (the benches size the state with it)")
    p.add_argument("--local", type=int, default=2, help="ranks per emulated node")
    p.add_argument("--faults", default=None, help=f"fault plan (default {DEFAULT_FAULTS!r}; 'none' for none)")
    p.add_argument("--data-timeout", type=_seconds_or_auto, default=AUTO,
                   help="seconds, or 'auto' (the default: measured at attach, rank 0 prints the values and why)")
    p.add_argument("--control-timeout", type=_seconds_or_auto, default=AUTO, help="seconds, or 'auto' (the default)")
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--running-stat", action="store_true",
                   help="fsdp2: a buffer every forward writes from the rank's own batch (BatchNorm-like)")
    p.add_argument("--no-reference", action="store_true", help="skip the uninterrupted reference run")
    p.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--no-rebind", action="store_true", help="ablation: replace groups but do not rebind")
    p.add_argument("--checkpoint-dir", default=None, help="verified checkpoints (L2 fallback) go here")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every K committed updates")
    p.add_argument("--max-restarts", type=int, default=3, help="restart budget enforced at attach")
    p.add_argument("--faults-every-attempt", action="store_true", help="re-inject the faults after restarts")
    p.add_argument("--replicate", default="off", choices=("off", "neighbour"),
                   help="Config.replicate: 'neighbour' copies each unreplicated shard to a ring neighbour's memory "
                        "after every step, so a spare can take over a fully sharded rank (--framework fsdp2-full)")
    p.add_argument("--on-loss", default="reject", choices=("reject", "shrink"),
                   help="Config.on_loss: 'shrink' goes on with the replica groups that are still whole when a rank "
                        "is lost and no spare is free (needs ACCELPACT_ON_LOSS=shrink at launch); the reference then "
                        "switches to the smaller world at the same frontier")
    p.add_argument("--envelope", default=None,
                   help="Config.envelope: the file `accelpact qualify` wrote (default: its default path, "
                        "else built-in), 'builtin' or 'permissive'")
    return p.parse_args(argv)


seed_all = seed_everything

#: The default group's timeout when the control timeout is measured at attach (set-up collectives
#: run before any measurement: model wrapping, the first all-gathers).
SETUP_TIMEOUT_S = 60.0


def _seconds_or_auto(text: str) -> float | str:
    return AUTO if text.strip().lower() == AUTO else float(text)


def build(args, generation: int):
    model, optimizer, data = build_hsdp_job(args.framework, layers=args.layers, dim=args.dim, seed=args.seed,
                                            local=args.local, generation=generation)
    if args.running_stat:
        add_running_stat(model, args.framework)
    return model, optimizer, data


def train(args, layout, *, protected: bool, generation: int, progress: bool):
    seed_all(args.seed)
    model, optimizer, data = build(args, generation)
    rt = None
    if protected:
        faults = DEFAULT_FAULTS if args.faults is None else ("" if args.faults == "none" else args.faults)
        config = accelpact.Config(
            data_timeout_s=args.data_timeout,
            control_timeout_s=args.control_timeout,
            trace_dir=args.trace_dir,
            rebind=not args.no_rebind,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every,
            max_restarts=args.max_restarts,
            envelope=args.envelope,
            replicate=args.replicate,
            on_loss=args.on_loss,
        )
        # faults= is the drill's (a trainer of yours drills with ACCELPACT_FAULTS instead)
        rt = accelpact.attach(model, optimizer, data_state=data, config=config,  # <- user line 1
                              faults=faults, faults_every_attempt=args.faults_every_attempt)
    rank = dist.get_rank()
    seen = 0
    t0 = time.perf_counter()
    start = rt.frontier if rt is not None else 0  # after a restart: resume at the restored checkpoint
    if rt is not None and rt.checkpointer is not None and rt.checkpointer.restored is not None and rank == 0:
        rep = rt.checkpointer.restored
        print(f"  restored verified checkpoint step {rep.step} in {rep.seconds:.3f}s "
              f"({len(rep.refused)} refused); replaying from update {start + 1}", flush=True)
    for i in range(start, args.updates):
        if rt is not None:  # <- user line 2: one optimizer update; it returns at the committed boundary
            loss = rt.step(lambda: stochastic_update(model, optimizer, data))
        else:
            loss = stochastic_update(model, optimizer, data)
        if rt is not None and rank == 0:
            for rec in rt.history[seen:]:
                print(f"\n  [rank 0] {rec.summary()}", flush=True)
            seen = len(rt.history)
        if progress and rank == 0:
            frontier = rt.frontier if rt is not None else i + 1
            generation_now = rt.generation if rt is not None else 0
            line = (f"  update {i + 1:3d}/{args.updates}  loss {loss:.4f}  F={frontier} "
                    f"g={generation_now}  recoveries={len(rt.history) if rt else 0}")
            print("\r" + line if sys.stdout.isatty() else line, end="" if sys.stdout.isatty() else "\n",
                  flush=True)
    elapsed = time.perf_counter() - t0
    snapshot = app_state.capture(
        model, optimizer, data, frontier=rt.frontier if rt else args.updates,
        opt_step=rt.opt_step if rt else args.updates,
    )
    history = [r.to_dict() for r in rt.history] if rt else []
    if rt is not None and rt.checkpointer is not None:
        history_extra = {"saves": rt.checkpointer.saves, "attempt": rt.attempt}
    else:
        history_extra = {}
    if rt is not None and rt.replicator is not None:  # under spares: the small-state replication's cost
        rep = rt.replicator
        history_extra["replicator"] = {"written": rep.written, "bytes": rep.bytes, "seconds": rep.seconds,
                                       "error": rep.error, "captures": rep.captures, "capture_s": rep.capture_s,
                                       "joins": rep.joins, "join_wait_s": rep.join_wait_s}
    if rt is not None and rt.neighbours is not None:  # neighbour copies: what they cost and hold
        history_extra["neighbours"] = rt.neighbours.stats()
    if rt is not None and rt.shrinks:  # the experiment changed: the reference must change with it
        history_extra["shrinks"] = list(rt.shrinks)
    if rt is not None:  # a world left behind takes no more link probes: one listener is live
        history_extra["probe_listeners"] = sum(t.name == "accelpact-reach" for t in threading.enumerate())
        rt.close()  # <- user line 3
    return snapshot, history, elapsed, history_extra



def reference_frontiers(args) -> dict[int, dict]:
    """The uninterrupted run on the whole world, with this rank's state at every frontier (a
    shrink's reference takes it from the frontier where the world shrank). Its groups are
    destroyed afterwards, so that the protected run records only its own."""
    from accelpact.rebind import data_plane_groups

    seed_all(args.seed)
    model, optimizer, data = build(args, generation=1000)
    states = {0: app_state.capture(model, optimizer, data)}
    for f in range(1, args.updates + 1):
        stochastic_update(model, optimizer, data)
        states[f] = app_state.capture(model, optimizer, data)
    for group in {id(g): g for g in data_plane_groups(model).values()}.values():
        dist.destroy_process_group(group)
    return states


def reference_after_shrink(args, frontiers: dict[int, dict], shrinks: list[dict]) -> dict:
    """The reference that switches replica count at the same frontier: a job built fresh in the
    smaller world, given this rank's reference state at F (its data stream resharded as the
    runtime does), trained on to the end."""
    if len(shrinks) != 1:
        raise SystemExit(f"the demo's reference follows one shrink; this run shrank {len(shrinks)} times")
    f = shrinks[0]["frontier"]
    model, optimizer, data = build(args, generation=2000)
    state = frontiers[f]
    data.shard = state["data/cursor"]["shard"]  # the stream this process read before the shrink
    app_state.restore(state, model, optimizer, data)
    data.reshard(dist.get_rank(), dist.get_world_size())
    for _ in range(f, args.updates):
        stochastic_update(model, optimizer, data)
    return app_state.capture(model, optimizer, data, frontier=args.updates, opt_step=args.updates)


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_s = SETUP_TIMEOUT_S if args.control_timeout == AUTO else args.control_timeout * 2
    accelpact.init_process_group("gloo", timeout=datetime.timedelta(seconds=setup_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.local:
        raise SystemExit(f"world size {world} is not a multiple of --local {args.local}")
    layout = HSDPLayout(nodes=world // args.local, local=args.local)
    if rank == 0:
        shape = (f"fully sharded over {world}" if args.framework == "fsdp2-full"
                 else f"HSDP {layout.nodes}x{layout.local}")
        print(f"AccelPact demo: {args.framework} {shape}, "
              f"{args.layers}-block decoder, {args.updates} updates, faults: "
              f"{DEFAULT_FAULTS if args.faults is None else args.faults}", flush=True)
    frontiers = None
    if args.on_loss == "shrink" and not args.no_reference:  # before the world can shrink
        if rank == 0:
            print("  uninterrupted reference run on the whole world (its state at every frontier kept) ...",
                  flush=True)
        frontiers = reference_frontiers(args)
    protected, history, t_protected, extra = train(args, layout, protected=True, generation=0, progress=True)
    rank, world = dist.get_rank(), dist.get_world_size()  # a shrink renumbers the ranks that go on
    verdict = {"rank": rank, "history": history, "protected_s": t_protected, **extra}
    if not args.no_reference:
        if rank == 0:
            print("\n  uninterrupted reference run ...", flush=True)
        t0 = time.perf_counter()
        if extra.get("shrinks"):
            reference = reference_after_shrink(args, frontiers, extra["shrinks"])
        else:
            reference, _, _, _ = train(args, layout, protected=False, generation=1000, progress=False)
        mismatches = app_state.diff(protected, reference)
        verdict.update(reference_s=time.perf_counter() - t0, mismatches=mismatches, compared=len(protected))
        if frontiers is not None:  # did the experiment change? the whole world's run ends elsewhere
            verdict["params_unlike_whole_world"] = sum(k.startswith("param/")
                                                       for k in app_state.diff(protected, frontiers[args.updates]))
    verdicts: list = [None] * world
    dist.all_gather_object(verdicts, verdict)
    code = 0
    if rank == 0:
        code = report(args, verdicts)
    dist.barrier()
    dist.destroy_process_group()
    return code


def report(args, verdicts) -> int:
    h0 = verdicts[0]["history"]
    print(f"\n\nrecoveries: {len(h0)}")
    for i, rec in enumerate(h0):
        # a spare that took over a rank joined later: its history starts at its own arrival
        per_rank = [v["history"][i] for v in verdicts if len(v["history"]) == len(h0)] or [rec]
        repair_ms = max(r["repair_s"] for r in per_rank) * 1e3
        detect_s = max(r["detect_s"] for r in per_rank)
        member = next((r for r in per_rank if r["rebound"]), per_rank[0])
        phases = "  ".join(f"{k} {v * 1e3:.1f}ms" for k, v in member["timings_s"].items())
        print(f"  #{rec['index']} update {rec['update']:3d}  {rec['action']:8s} groups {','.join(rec['failed_groups'])}"
              f"  detect {detect_s:.2f}s  repair {repair_ms:.1f}ms  refs rebound {sum(member['rebound'].values())}")
        print(f"       phases (a rank in R): {phases}")
        if rec.get("failed_groups"):
            adopted = set(rec.get("adopted", ()))
            how = ", ".join(f"{g} {'adopted its standby' if g in adopted else 'built'}" for g in rec["failed_groups"])
            standby_ms = max(r.get("standby_s", 0.0) for r in per_rank) * 1e3
            print(f"       successors: {how}; standbys connected again after the release in {standby_ms:.1f}ms")
        shrink = (rec.get("replacement") or {}).get("shrink")
        if shrink:
            print(f"       lost {shrink['lost']}: the job shrank at F={shrink['frontier']} from "
                  f"{shrink['replicas_before']} to {shrink['replicas_after']} replica(s), {shrink['world_size_before']} "
                  f"to {shrink['world_size_after']} ranks (rank(s) {shrink['left']} left with their replica group); "
                  f"effective batch {shrink['effective_batch_before']} -> {shrink['effective_batch_after']} "
                  "samples per update")
        elif rec.get("replacement"):
            r = rec["replacement"]
            if nobody_lost(r):  # the control plane failed with every rank alive
                print("       nobody lost: the world was rebuilt around the same members")
            else:
                moved = ", ".join(f"rank {t['lost']} <- rank {t.get('from', r.get('rank', '?'))}: {t['bytes']} B"
                                  f"{' (neighbour copy)' if t.get('via') == 'neighbour' else ''}"
                                  for t in r["transfers"])
                copies = sorted(k for k, v in r.get("via", {}).items() if v == "neighbour")
                print(f"       lost {r['lost']}, spares {r['spares']} took over, state from {r['sources']}"
                      f"{f' (neighbour copy of rank(s) {copies})' if copies else ''}"
                      f"{' (' + moved + ')' if moved else ''}")
            if r.get("rolled"):  # a member lost inside the boundary check of the frontier
                print(f"       rank(s) {r['rolled']} missed the outcome of the boundary check of update "
                      f"{rec['frontier']} and committed it in the change (rolled forward)")
    ok = True
    if "mismatches" in verdicts[0]:
        against = ("the reference that shrinks at the same frontier" if verdicts[0].get("shrinks")
                   else "uninterrupted reference")
        print(f"\nbitwise verdict vs {against} (params, optimizer state, step, RNG, data cursor):")
        for v in verdicts:
            mism = v["mismatches"]
            status = "IDENTICAL" if not mism else f"DIFFERENT ({app_state.categories(mism)})"
            ok &= not mism
            print(f"  rank {v['rank']}: {v['compared']} entries {status}")
    in_memory = all(r["action"] in ("preserve", "rewind", "replace", "shrink") for r in h0)
    if args.result:
        with open(args.result, "w") as fh:
            json.dump({"verdicts": verdicts, "bitwise_ok": ok, "all_in_memory": in_memory}, fh, default=str)
    print("\nresult:", "PASS" if ok and in_memory else "FAIL", flush=True)
    return 0 if ok and in_memory else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sys.exit(main())
