"""How the code every rank runs grows with the world size: the decisions of a recovery (on the
gathered reports of every rank), the digest check, the membership decision, and the per-update
boundary bookkeeping, timed on synthetic inputs of 8 to 1,024 ranks.

Why: a rule that compares every rank with every peer is invisible at 4 ranks and costs seconds at
1,024 (the replica-digest layout check was W³: 11 s per check at 1,024 ranks; the straggler
verdict W²: 74 ms per update). `k` is the apparent growth exponent between the last two sizes:
about 1 is linear in the input (a DDP report names all W ranks, so its input is already W²).

    python bench/scale.py [substring ...]   # only the cases whose name contains one
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

from _common import write_json

from accelpact.control.clock import VectorClock
from accelpact.fsm.decisions import GroupId, RankReport, ReleaseVote, decide_agreement, decide_release
from accelpact.fsm.deferral import DeferralFacts, why_synchronous
from accelpact.fsm.phases import FailurePhase
from accelpact.integrity.agreement import HolderDigest
from accelpact.integrity.agreement import decide_agreement as digest_agreement
from accelpact.membership.decide import Presence, decide_membership
from accelpact.membership.shrink import plan_shrink
from accelpact.observe.incident import peers_of
from accelpact.stragglers import StragglerWindow

WS = [8, 64, 256, 1024]
C = FailurePhase.COMMITTED


def timeit(fn, budget=0.3, max_reps=2000):
    fn()  # warm
    best, n, t0 = math.inf, 0, time.perf_counter()
    while n < max_reps and (n == 0 or time.perf_counter() - t0 < budget):
        t = time.perf_counter()
        fn()
        best, n = min(best, time.perf_counter() - t), n + 1
    return best


def jl(x):  # JSON round trip: ints > 256 become distinct objects, as after a gather
    return json.loads(json.dumps(x))


CASES = {}


def case(name):
    def deco(f):
        CASES[name] = f
        return f
    return deco


# ---- fsm.decisions ------------------------------------------------------------------------------
def world_group(W):
    return GroupId("replicate", tuple(range(W)))


def replicate_group(r, W, S):
    """Rank r's replicate group in an HSDP layout of shard groups of S ranks."""
    return GroupId("replicate", tuple(range(r % S, W, S)))


def gathered(report):
    """`report` as rank 0 holds it after the control plane's gather (a JSON round trip)."""
    return RankReport.from_dict(jl(report.to_dict()))


@case("decide_agreement preserve (DDP: every rank reports world group failed)")
def _(W):
    reps = [gathered(RankReport(r, 5, 0, 5, C, (world_group(W),))) for r in range(W)]
    return lambda: decide_agreement(reps, W)


@case("decide_agreement preserve (HSDP 8-rank shard groups, failed: one replicate group)")
def _(W):
    S = min(8, W)
    reps = [gathered(RankReport(r, 5, 0, 5, C, (replicate_group(r, W, S),))) for r in range(W)]
    return lambda: decide_agreement(reps, W)


@case("decide_agreement rewind ok (held: world + shard groups)")
def _(W):
    S = min(8, W)

    def rep(r):
        held = (replicate_group(r, W, S), GroupId("shard", tuple(range(r - r % S, r - r % S + S))))
        return gathered(RankReport(r, 5, 0, 5, FailurePhase.BACKWARD, held, rewind_phases=(FailurePhase.BACKWARD,),
                                   rerun_ok=True, held_groups=held + (world_group(W),)))
    reps = [rep(r) for r in range(W)]
    return lambda: decide_agreement(reps, W)


@case("decide_agreement rewind reject (half stepped, no step copy)")
def _(W):
    def rep(r):
        return RankReport(r, 5, 0, 6 if r % 2 else 5, FailurePhase.OPTIMIZER if r % 2 else FailurePhase.BACKWARD,
                          rewind_phases=(FailurePhase.BACKWARD, FailurePhase.OPTIMIZER), rerun_ok=True,
                          held_groups=(GroupId("replicate", (r,)),))
    reps = [rep(r) for r in range(W)]
    return lambda: decide_agreement(reps, W)


@case("gather_reports parse: W x RankReport.from_dict (DDP world group)")
def _(W):
    d = [jl(RankReport(r, 5, 0, 5, C, (world_group(W),), held_groups=(world_group(W),)).to_dict()) for r in range(W)]
    return lambda: [RankReport.from_dict(x) for x in d]


@case("decide_release")
def _(W):
    votes = [ReleaseVote(r, True) for r in range(W)]
    return lambda: decide_release(votes, W)


@case("why_synchronous (deferral)")
def _(W):
    f = DeferralFacts(mode="deferred", in_step=True, rewind_phases=(FailurePhase.FORWARD, FailurePhase.BACKWARD),
                      step_copy=False, has_cursor=True, checkpoint_due=False, digest_due=False)
    return lambda: why_synchronous(f)


# ---- membership ---------------------------------------------------------------------------------
def presences(W, lost, replicas_of, shard_of=lambda p: (p,), on_loss="reject"):
    return [Presence.from_json(jl(Presence(p, 4, 0, True, replicas=replicas_of(p), shard_group=shard_of(p),
                                           on_loss=on_loss, shrink_ok=True).to_json()))
            for p in range(W) if p not in lost]


@case("decide_membership DDP (replicas=world), 1 lost")
def _(W):
    lost = {W // 2}
    reps = presences(W, lost, lambda p: tuple(range(W)))
    return lambda: decide_membership(world=0, world_size=W, reports=reps, free_spares=[W],
                                     small_state_at={p: {4} for p in lost})


@case("decide_membership DDP (replicas=world), 8 lost (a node)")
def _(W):
    lost = set(range(min(8, W // 2)))
    reps = presences(W, lost, lambda p: tuple(range(W)))
    return lambda: decide_membership(world=0, world_size=W, reports=reps, free_spares=list(range(W, W + 8)),
                                     small_state_at={p: {4} for p in lost})


@case("decide_membership HSDP (shard 8), 1 lost")
def _(W):
    S = min(8, W // 2)
    lost = {W // 2}
    reps = presences(W, lost, lambda p: tuple(range(p % S, W, S)))
    return lambda: decide_membership(world=0, world_size=W, reports=reps, free_spares=[W],
                                     small_state_at={p: {4} for p in lost})


@case("decide_membership shrink (HSDP shard 8, no spare), 1 lost")
def _(W):
    S = min(8, W // 2)
    lost = {W // 2}
    reps = presences(W, lost, lambda p: tuple(range(p % S, W, S)), lambda p: tuple(range(p - p % S, p - p % S + S)),
                     on_loss="shrink")
    return lambda: decide_membership(world=0, world_size=W, reports=reps, free_spares=[],
                                     small_state_at={p: {4} for p in lost})


@case("plan_shrink (FSDP-ish shard groups of W/4), 1 lost")
def _(W):
    S = W // 4
    lost = (W // 2,)
    reps = presences(W, set(lost), lambda p: (), lambda p: tuple(range(p - p % S, p - p % S + S)), on_loss="shrink")
    return lambda: plan_shrink(world_size=W, lost=lost, reports=reps)


# ---- integrity ----------------------------------------------------------------------------------
@case("integrity.decide_agreement DDP (holders=world)")
def _(W):
    reps = [HolderDigest(r, tuple(jl(list(range(W)))), "d" * 64) for r in range(W)]
    return lambda: digest_agreement(reps)


@case("integrity.decide_agreement HSDP (shard 8: holders=W/8)")
def _(W):
    S = min(8, W)
    reps = [HolderDigest(r, tuple(jl(list(range(r % S, W, S)))), "d" * 64) for r in range(W)]
    return lambda: digest_agreement(reps)


# ---- observe ------------------------------------------------------------------------------------
@case("peers_of (failed group = world, all observed)")
def _(W):
    key = world_group(W).key
    obs = list(range(W))
    return lambda: peers_of(0, [key], obs)


@case("peers_of (failed group = world, 1 observer)")
def _(W):
    key = world_group(W).key
    return lambda: peers_of(0, [key], [0])


# ---- per update ---------------------------------------------------------------------------------
@case("VectorClock.merge (per exchange)")
def _(W):
    vc = VectorClock(0, W)
    other = list(range(W))
    return lambda: vc.merge(other)


@case("StragglerWindow.add x8 (window 32: 8 boundaries, one verdict)")
def _(W):
    import random
    win = StragglerWindow(W, window=32, factor=1.5)
    times = [random.random() for _ in range(W)]
    for _ in range(32):
        win.add(times)

    def quarter_window():  # the verdict is judged every 8th boundary: time all 8
        for _ in range(win.every):
            win.add(times)
    return quarter_window


@case("ControlPlane boundary_post+result (the collective mocked)")
def _(W):
    import torch

    from accelpact.config import Config
    from accelpact.control import plane as P
    from accelpact.control.plane import ControlPlane
    from accelpact.runtime.stragglers import StragglerWatch

    class Work:
        def wait(self):
            return True

    class Group:  # the collective, mocked: the boundary posts straight to its group
        def allreduce(self, tensors, opts):
            return Work()

    cp = object.__new__(ControlPlane)
    cp.rank, cp.world_size, cp.seq, cp.cut_short, cp.group = 0, W, 0, None, Group()
    cp._max = P.dist.AllreduceOptions()
    cp.clock = VectorClock(0, W)
    cp._flag = torch.zeros(1 + 2 * W, dtype=torch.int64)
    cp._flag_np = cp._flag.numpy()
    cp._flag_np[1:1 + W] = 1000  # every rank reported a time
    cp.update_times = (None,) * W
    watch = StragglerWatch(cp, Config(), rank=0, world_size=W)
    watch._released = time.perf_counter()

    def once():
        work = watch.post(0)
        cp._flag_np[1:1 + W] = 1000
        watch.settle(work)
    return once


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    unknown = [a for a in argv if not any(a in name for name in CASES)]
    if unknown:  # found by review: a typo matched nothing and overwrote the results with an empty run
        print(f"no case matches {unknown}; the cases are:\n  " + "\n  ".join(CASES), file=sys.stderr)
        return 2
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"µs per call (best of repeats), {os.cpu_count()} cores, load {load}")
    print(f"{'case':78s} " + " ".join(f"{'W=' + str(w):>11s}" for w in WS) + "   k")
    rows = []
    for name, build in CASES.items():
        if argv and not any(o in name for o in argv):
            continue
        ts = [timeit(build(w)) for w in WS]
        k = math.log(ts[-1] / ts[-2], WS[-1] / WS[-2]) if ts[-2] > 0 else float("nan")
        rows.append({"case": name, "seconds": dict(zip(map(str, WS), ts)), "k": k})
        print(f"{name[:78]:78s} " + " ".join(f"{t * 1e6:11.1f}" for t in ts) + f"   {k:4.2f}", flush=True)
    print(f"wrote {write_json('scale', {'load': load, 'cores': os.cpu_count(), 'cases': rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
