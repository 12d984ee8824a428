"""Property-based fault campaigns on the real 4-rank CPU runtime (hypothesis).

A schedule is 1-10 faults (kind@update:phase:rank). For each one the real runtime trains under
the faults; the campaign asserts the outcome the envelope prescribes (Preserve at committed
boundaries, Rewind for updates interrupted in forward/backward, Reject for a split optimizer step,
all-or-nothing; `--envelope paper`: Reject for everything uncommitted), bitwise state against an
uninterrupted reference when recovered in memory and after a checkpoint restart when rejected, one
frontier and generation on every rank, and that the recorded trace is a behaviour of
spec/AccelPact.tla (TLC).

    python -m accelpact.testing.campaign                 the CI profile: 2 derandomised schedules
    python -m accelpact.testing.campaign --campaign --examples 200 --summary out.json [--seed N] [--envelope paper]
    python -m accelpact.testing.campaign --sim --campaign --examples 5000 [--seed N]   pure simulation
    python -m accelpact.testing.campaign --campaign --spares 2 --examples 40 --keep-going --summary out.json

With `--spares S` every schedule runs on 4 active ranks + S hot spares (each a process, the store
hosted here as torchrun's agent would): a killed rank's position is taken over in memory
(Replace), and the summary counts it as recovered in memory (`expected_with_spares`); a kill may
then also strike right after a rank's boundary check (`kill@U:check:R`, `check_kills_as_seen`). With
`--profile fsdp2-full` the job is FSDP2 fully sharded over the 4 ranks (no replica holds a
shard) with `Config.replicate="neighbour"`: a killed rank's state comes from the copy in its ring
successor's memory.

The expectation (`expected`) is pure; `run_schedule` is the effectful part. A failing schedule is
shrunk by hypothesis and printed with the seed (and a @reproduce_failure blob) to replay it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

WORLD = 4
#: ranks per emulated node of the drill's HSDP 2x2: replica peers (the holders of one shard)
#: share `rank % LOCAL`
LOCAL = 2
PHASES = ("forward", "backward", "optimizer", "committed")
#: with spares a kill may also strike at the boundary check (`kill@U:check:R`: right after the
#: rank's check of update U completed, before it commits; `accelpact.faults.plan.BOUNDARY_STEPS`)
CHECK = "check"
#: with spares a kill may also strike as the checkpoint save after a commit begins (`kill@U:save:R`,
#: `accelpact.faults.plan.AFTER_COMMIT_STEPS`): the spares jobs save every SPARES_CHECKPOINT_EVERY
#: updates, so only a due update's save can be struck
SAVE = "save"
SPARES_CHECKPOINT_EVERY = 2
#: the campaign's job shapes: HSDP 2x2 (replica peers hold each shard), or FSDP2 fully sharded
#: over the 4 ranks with neighbour copies (rank r's copy in rank r+1's memory)
PROFILES = ("hsdp", "fsdp2-full")
KINDS = ("skip", "late", "kill")


@dataclass(frozen=True, order=True)
class Fault:
    update: int
    phase: str
    rank: int
    kind: str

    def __str__(self) -> str:
        return f"{self.kind}@{self.update}:{self.phase}:{self.rank}"


#: The campaign's rewind budget per update: above the most mid-update faults one update can hold,
#: so every fault that fires gets its rewind and the expectation stays exact (the budget of a
#: real job, Config.max_rewinds_per_update, has its own tests).
REWIND_BUDGET = 2 * WORLD
_LETTER = {"preserve": "P", "rewind": "W", "reject": "R", "replace": "X"}
#: outcomes that finish the job in memory (no restart)
IN_MEMORY = ("preserve", "rewind", "replace", "shrink")


@dataclass(frozen=True)
class Expectation:
    """What the envelope prescribes for a schedule."""

    outcome: str  # "preserve" | "rewind" | "replace" (in memory) | "reject" | "killed"
    preserved_updates: tuple[int, ...]  # updates whose committed faults are recovered in memory
    reject_update: int | None  # the update that ends the first attempt (reject or kill)
    #: a kill that another rank's earlier fault in the same update may pre-empt: the killed rank
    #: then fails in a collective before it reaches its kill point, and every rank rejects
    may_reject: bool = False
    rewound_updates: tuple[int, ...] = ()  # updates interrupted mid-update and re-run in memory
    #: the first attempt's recoveries, one token per update (P preserve, W rewind, R reject,
    #: X replace)
    tokens: tuple[str, ...] = ()
    replaced_updates: tuple[int, ...] = ()  # spares: updates where a lost rank's position was taken over
    #: faults that never fire: with spares, a rank's faults after its own kill in the same update
    #: (its spare starts after that update; without spares the attempt ends there anyway)
    unfired: tuple[Fault, ...] = ()
    #: other ways the schedule may end (spares: two replica peers of one shard lost in the same
    #: pass leave no holder of their state), each a prescription of its own
    alternatives: tuple[Expectation, ...] = ()

    def branch(self, actions: Sequence[str], *, observed: str) -> Expectation | None:
        """The prescription (this one or an alternative) that the observed run followed."""
        for e in (self, *self.alternatives):
            if e.outcome == observed and e._fits(actions, observed) is not None:
                return e
        return None

    def matches(self, actions: Sequence[str], *, observed: str) -> int | None:
        """Extra unscheduled Preserves if the recoveries fit the prescription, else None. A Preserve
        no fault scheduled (a peer slower than the data timeout at a boundary) is a real failure
        the runtime must recover, so one may appear anywhere; nothing else may differ. With
        `alternatives`, the recoveries may fit any prescription that ends as observed."""
        if self.alternatives:
            fits = [e._fits(actions, observed) for e in (self, *self.alternatives) if e.outcome == observed]
            return min((f for f in fits if f is not None), default=None)
        return self._fits(actions, observed)

    def _fits(self, actions: Sequence[str], observed: str) -> int | None:
        tokens = list(self.tokens)
        if observed == "reject" and self.outcome != "reject":  # the may_reject alternative
            tokens = [t for t in tokens if t != "KILL"] + ["W*R"]
        tokens = [t for t in tokens if t != "KILL"]
        letters = "".join(_LETTER.get(a, "?") for a in actions)
        if not re.fullmatch("P*" + "".join(f"(?:{t})P*" for t in tokens), letters):
            return None
        if re.fullmatch("".join(f"(?:{t})" for t in tokens), letters):
            return 0
        optional = sum(t.count("P?") for t in tokens)
        return max(1, letters.count("P") - tokens.count("P") - optional)


def plan(faults: Sequence[Fault]) -> str:
    return ",".join(str(f) for f in sorted(faults))


def parse_plan(text: str) -> tuple[Fault, ...]:
    """Inverse of `plan` (summaries store schedules as plans)."""
    out = []
    for item in filter(None, text.split(",")):
        kind, _, rest = item.partition("@")
        update, phase, rank = rest.split(":")
        out.append(Fault(int(update), phase, int(rank), kind))
    return tuple(sorted(out))


def fault_shares(results: Sequence[tuple[str, str] | tuple[str, str, Sequence[str]]], *, rewind: bool,
                 spares: int = 0, deferred_updates: int = 0, profile: str = "hsdp") -> dict[str, int | float]:
    """Of the faults that fired in first attempts, how many were recovered in memory.

    `results` are (schedule plan, observed outcome[, the first attempt's recoveries: with spares
    they tell which alternative a run followed]). A schedule recovered in memory counts all
    its faults; one that ended in a restart or a kill counts the faults of the updates before
    the one that ended it (that update's own faults, and any rewound before its end, count as
    not recovered); faults of later updates never fired. With spares, a rank's faults after its
    own kill in the same update never fire either (`Expectation.unfired`) and are not counted.
    `deferred_updates`: the runs deferred their clean boundaries over that many updates; their
    faults are counted as the synchronous run they equal would meet them (`deferred_equivalent`)."""
    fired = in_memory = 0
    for schedule, observed, *rest in results:
        faults = parse_plan(schedule)
        exp = (expected_deferred(faults, updates=deferred_updates) if deferred_updates
               else expected(faults, rewind=rewind, spares=spares, profile=profile))
        if deferred_updates:
            faults = deferred_equivalent(faults, updates=deferred_updates)
        if observed in IN_MEMORY:
            n = len(faults) - len(exp.unfired)
            fired += n
            in_memory += n
            continue
        if exp.alternatives and (rest or observed != exp.outcome):
            picked = exp.branch(rest[0] if rest else (), observed=observed)
            if picked is None:  # which alternative it followed is unknown: skip it
                continue
            exp = picked
        end = exp.reject_update
        if end is None:  # observed differs from the prescription (a failed schedule): skip it
            continue
        counted = [f for f in faults if f not in exp.unfired]
        fired += sum(1 for f in counted if f.update <= end)
        in_memory += sum(1 for f in counted if f.update < end)
    return {"faults_fired": fired, "faults_in_memory": in_memory,
            "faults_in_memory_share": round(in_memory / max(1, fired), 3)}


def struck_phase(f: Fault) -> str:
    """The phase whose collective fails. A `late` rank sleeps where the fault names and then
    carries on; in the optimizer phase nothing communicates until the boundary health check, so
    the first collective to fail (its own and its peers') is the committed boundary's."""
    return "committed" if f.kind == "late" and f.phase == "optimizer" else f.phase


#: `--boundary deferred`: a checkpoint every DEFERRED_CHECKPOINT_EVERY updates, so that the run
#: mixes synchronous boundaries (a checkpoint is due) and deferred ones (`fsm.deferral`)
DEFERRED_CHECKPOINT_EVERY = 2


def deferred_equivalent(faults: Sequence[Fault], *, updates: int,
                        checkpoint_every: int = DEFERRED_CHECKPOINT_EVERY) -> tuple[Fault, ...]:
    """The schedule a synchronous run would meet, for a run whose clean boundaries are deferred.

    A deferred boundary has no probes, so a `skip` or `late` there strikes at the next collective
    the rank meets: the next update's forward (`FaultInjector`). A `late` rank inside the step
    reaches its boundary late, but nobody waits for it there: its peers wait for it in the next
    forward instead. After the last update there is no next forward, and the fault never fails
    anything. A boundary with a checkpoint due is synchronous: its faults stay."""
    out = []
    for f in faults:
        deferred = not checkpoint_every or f.update % checkpoint_every
        if f.kind == "kill" or struck_phase(f) != "committed" or not deferred:
            out.append(f)
        elif f.update < updates:
            out.append(Fault(f.update + 1, "forward", f.rank, f.kind))
    return tuple(sorted(out))


def expected_deferred(faults: Sequence[Fault], *, updates: int,
                      checkpoint_every: int = DEFERRED_CHECKPOINT_EVERY) -> Expectation:
    """The prescription of a run whose clean boundaries are deferred: that of the synchronous
    schedule it equals, with one more way to end. A split step at update u (a rank failed inside
    its optimizer step) leaves its peers past a deferred boundary u, in update u+1's forward and
    backward, until they settle; a kill planned there strikes first, and the attempt may end
    killed instead of rejected. Either way it ends at u (the kill is on the thrown-away update)."""
    exp = expected(deferred_equivalent(faults, updates=updates, checkpoint_every=checkpoint_every))
    u = exp.reject_update
    if exp.outcome != "reject" or u is None or (checkpoint_every and u % checkpoint_every == 0):
        return exp
    if not any(f.kind == "kill" and f.update == u + 1 and f.phase in ("forward", "backward") for f in faults):
        return exp
    killed = Expectation("killed", exp.preserved_updates, u, rewound_updates=exp.rewound_updates, tokens=("KILL",))
    return dataclasses.replace(exp, alternatives=(*exp.alternatives, killed))


def _preempted(kill: Fault, same_update: Sequence[Fault]) -> bool:
    """A skip or late in an earlier phase of the same update makes the killed rank fail in a
    collective before it reaches its kill point: on another rank, its peers time out; on the
    killed rank itself, a skip raises and a late rank meets closed connections."""
    return any(f.kind != "kill" and PHASES.index(f.phase) < PHASES.index(kill.phase) for f in same_update)


def expected(faults: Sequence[Fault], *, rewind: bool = True, spares: int = 0, profile: str = "hsdp") -> Expectation:
    """Faults fire update by update. An update whose faults all strike at the committed boundary
    is preserved, unless no peer meets them (`unmet_at_boundary`). With Rewind (the envelope qualifies it for forward and backward), an update
    interrupted mid-update is rewound once per firing of its mid-update faults (faults that fire
    together share one rewind; a fault never fires twice) and may then be preserved at its
    boundary; a skip inside optimizer.step() leaves a split step (no pre-step copy) and ends the
    attempt in Restart. Without Rewind (the paper's envelope) any uncommitted fault does.
    A kill ends the attempt: the process is gone — unless the job runs with `spares` (see
    `expected_with_spares`)."""
    if spares:
        if not rewind:
            raise ValueError("spares need rt.step (the whole new world re-runs the interrupted update): "
                             "the paper's envelope has no Rewind")
        return expected_with_spares(faults, spares, profile=profile)
    preserved: list[int] = []
    rewound: list[int] = []
    tokens: list[str] = []

    def out(outcome: str, end: int | None, may_reject: bool = False) -> Expectation:
        return Expectation(outcome, tuple(preserved), end, may_reject, tuple(rewound), tuple(tokens))

    unmet = unmet_at_boundary(faults, profile)
    for update in sorted({f.update for f in faults}):
        here = [f for f in faults if f.update == update]
        kills = [f for f in here if f.kind == "kill"]
        soft = [f for f in here if f.kind != "kill" and f not in unmet]
        mid = [f for f in soft if struck_phase(f) in ("forward", "backward")]
        in_step = [f for f in soft if struck_phase(f) == "optimizer"]
        at_boundary = [f for f in soft if struck_phase(f) == "committed"]
        if not rewind:
            if kills:
                tokens.append("KILL")
                return out("killed", update, all(_preempted(k, here) for k in kills))
            if mid or in_step:
                tokens.append("R")
                return out("reject", update)
            if at_boundary:
                tokens.append("P")
                preserved.append(update)
            continue
        before = f"W{{0,{len(mid)}}}" if mid else ""
        if kills:
            # pre-empted kills fire in the re-run after a rewind; a split step may end it first
            tokens.append("KILL")
            return out("killed", update, bool(in_step))
        if in_step:
            tokens.append(before + "R")
            return out("reject", update)
        if mid:
            tokens.append(f"W{{1,{len(mid)}}}" + ("P?" if at_boundary else ""))
            rewound.append(update)
            continue
        if at_boundary:
            tokens.append("P")
            preserved.append(update)
    return out("rewind" if rewound else "preserve", None)


def _interleavings(min_x: int, max_x: int, max_w: int) -> str:
    """Every sequence of min_x..max_x Replaces (X) and at most max_w Rewinds (W), as a regex."""
    seqs = set()
    for x in range(min_x, max_x + 1):
        for w in range(max_w + 1):
            for at in itertools.combinations(range(x + w), x):
                seqs.add("".join("X" if i in at else "W" for i in range(x + w)))
    return "(?:" + "|".join(sorted(seqs, key=lambda q: (-len(q), q))) + ")"


def shares_holder(a: int, b: int, profile: str = "hsdp") -> bool:
    """Ranks `a` and `b` lost together may leave a shard without a live holder: HSDP's replica
    peers of one shard; fully sharded with neighbour copies, a rank and the ring successor whose
    memory keeps its copy (in the same update the successor's replacement holds no copy yet)."""
    if profile == "fsdp2-full":
        return b == (a + 1) % WORLD or a == (b + 1) % WORLD
    return a % LOCAL == b % LOCAL


def check_kills_as_seen(faults: Sequence[Fault], profile: str = "hsdp") -> tuple[tuple[Fault, ...], tuple[Fault, ...],
                                                                                 int | None]:
    """A kill at the boundary check or at the save after a commit, as the survivors meet it: (the
    schedule with each such kill moved, the faults that never fire, the update a kill after a
    dirty check ends the attempt in).

    `kill@U:check:R` strikes after R's check of U completed. A clean check commits U on every
    survivor (R's state of U is in the store: it was written before its contribution left), and
    they find R gone in the forward of U+1: the schedule is then the one with `kill@U+1:forward:R`,
    and R's own faults of update U+1 never fire (its spare starts at U, and the faults of the
    update it takes over fired in the process it replaced). A check that some rank's fault made
    dirty starts a recovery that R dies in: a member lost inside a recovery is not replaced, every
    survivor rejects. Any skip or late of U that fires makes it dirty, at U's boundary or inside
    U (R's own too: a rank whose update failed still runs the check): the pass of U that meets it
    ends in a check that needs a recovery, and a pass that meets another rank's kill first ends in
    a Replace, whose re-run meets it. A check kill whose rank died earlier in U never fires.

    `kill@U:save:R` strikes as the save due after U's commit begins, after every recovery of U:
    the survivors meet the loss in the save, at F = U with nothing in flight, and R's spare starts
    at U, as after a clean check kill; so it is moved the same way (met before U+1 instead of in
    its forward: the same Replace, and U+1's own faults then fire in the new world, which the
    moved kill's re-run allows). It never makes a check dirty, and never fires when R died earlier
    in U (a kill in a phase of U or at its check)."""
    out, unfired, dirty_end = [], [], None
    checks = [f for f in faults if f.kind == "kill" and f.phase in (CHECK, SAVE)]
    for f in faults:
        if f not in checks:
            out.append(f)
    for k in checks:
        before = PHASES + ((CHECK,) if k.phase == SAVE else ())  # where R may have died first in U
        if any(f.kind == "kill" and f.rank == k.rank and f.update == k.update and f.phase in before for f in faults):
            unfired.append(k)
            continue
        if k.phase == CHECK and any(f.update == k.update and _soft_fires(f, faults, profile) for f in faults):
            dirty_end = k.update if dirty_end is None else min(dirty_end, k.update)
            continue
        gone = [f for f in out if f.rank == k.rank and f.update == k.update + 1]
        moved = Fault(k.update + 1, "forward", k.rank, "kill")
        unfired += [f for f in gone if f != moved]  # a kill of R in U+1 too (seeds 78, 79: counted as killed)
        out = [f for f in out if f not in gone] + [moved]
    return tuple(sorted(set(out))), tuple(unfired), dirty_end


def _soft_fires(f: Fault, faults: Sequence[Fault], profile: str = "hsdp") -> bool:
    """A skip or late that fires and is met by a peer (`unmet_at_boundary`)."""
    return _struck(f, faults) and f not in unmet_at_boundary(faults, profile)


def _struck(f: Fault, faults: Sequence[Fault]) -> bool:
    """A skip or late that fires: its rank is not killed at or before its phase of that update
    (a kill at the boundary strikes before any probe)."""
    return f.kind != "kill" and f.phase in PHASES and not any(
        g.kind == "kill" and g.rank == f.rank and g.update == f.update and g.phase in PHASES
        and PHASES.index(g.phase) <= PHASES.index(f.phase) for g in faults)


def probed_group(rank: int, profile: str = "hsdp") -> frozenset[int]:
    """The ranks of the group whose boundary probe a skip or late at `committed` strikes on `rank`
    (`FaultInjector.probe_order`): its replica group in HSDP 2x2, the one shard group over every
    rank fully sharded (no replica group: the injector takes the rank's last probed group)."""
    if profile == "fsdp2-full":
        return frozenset(range(WORLD))
    return frozenset(r for r in range(WORLD) if r % LOCAL == rank % LOCAL)


def unmet_at_boundary(faults: Sequence[Fault], profile: str = "hsdp") -> frozenset[Fault]:
    """The boundary skips and lates no peer meets: every member of the probed group is struck the
    same way at that boundary, so nobody waits in the probe (all skip it, or all arrive late
    together) and the boundary passes as a clean one. Found by the spares campaign (seed 15):
    `skip@4:committed:1` with `skip@4:committed:3`, replica peers, was prescribed a Preserve that
    no real run can show (without spares too). A late in the optimizer phase is not a probe's:
    its shard peers wait in the boundary's first probe."""
    struck = [f for f in faults if f.phase == "committed" and f.kind in ("skip", "late") and _struck(f, faults)]
    unmet = set()
    for f in struck:
        group = probed_group(f.rank, profile)
        alike = {g.rank for g in struck if g.update == f.update and g.kind == f.kind and g.rank in group}
        if alike == group:
            unmet.add(f)
    return frozenset(unmet)


def expected_with_spares(faults: Sequence[Fault], spares: int, *, profile: str = "hsdp") -> Expectation:
    """The prescription when the job runs with `spares` hot spares and every update as rt.step.

    The runtime then keeps a pre-step copy (`step_copy`, forced with spares), so a skip inside
    optimizer.step() is rewound like a forward/backward fault instead of splitting the step. A
    kill no longer ends the attempt while a spare is free: the survivors agree on the lost rank,
    a spare takes its position with the state of its replica peer, and the whole new world
    re-runs the update (Replace, X). Per update, with the rank's faults after its own kill
    removed (they never fire: its spare starts after that update):

    - each killed rank costs one spare; kills that fire in the same pass share one Replace, so an
      update holds 1..k Replaces for k killed ranks;
    - a kill is pre-empted when an earlier fault makes the killed rank fail before its kill point:
      the update is then rewound first and the kill fires in the re-run; a soft fault that did not
      fire before the Replace fires in the new world's re-run. Either way every Rewind needs a
      fault firing, so an update holds at most as many Rewinds as mid-update faults, in any order
      with its Replaces, and a boundary fault of the update may be preserved after them (P?);
    - more killed ranks than free spares: a loss that cannot be replaced, the survivors reject
      and the job restarts cold ("killed", ending the first attempt in that update);
    - two replica peers of one shard killed in one update may die in the same pass, leaving no
      holder of their state: the schedule may then end "killed" there (`alternatives`); fully
      sharded, a rank and the holder of its neighbour copy (`shares_holder`).
    """
    faults, moved_unfired, dirty_end = check_kills_as_seen(faults, profile)
    unmet = unmet_at_boundary(faults, profile)
    free = spares
    preserved: list[int] = []
    rewound: list[int] = []
    replaced: list[int] = []
    tokens: list[str] = []
    unfired: list[Fault] = list(moved_unfired)
    alternatives: list[Expectation] = []

    def out(outcome: str, end: int | None) -> Expectation:
        return Expectation(outcome, tuple(preserved), end, False, tuple(rewound), tuple(tokens), tuple(replaced),
                           tuple(unfired), tuple(alternatives))

    for update in sorted({f.update for f in faults}):
        if dirty_end is not None and update > dirty_end:
            break
        here = [f for f in faults if f.update == update]
        if update == dirty_end:  # a check kill after a dirty check: lost inside the recovery it starts
            mid = [f for f in here if f.kind != "kill" and struck_phase(f) != "committed"]
            kills = [f for f in here if f.kind == "kill"]  # Replaces, then the re-run's dirty check
            tokens.append(_interleavings(0, min(free, len(kills)), len(mid)) + "R")
            return out("killed", update)
        first_kill = {}
        for f in here:
            if f.kind == "kill":
                first_kill[f.rank] = min(first_kill.get(f.rank, len(PHASES)), PHASES.index(f.phase))
        live = []
        for f in here:
            if f.rank in first_kill and PHASES.index(f.phase) > first_kill[f.rank]:
                unfired.append(f)
            else:
                live.append(f)
        kills = [f for f in live if f.kind == "kill"]
        soft = [f for f in live if f.kind != "kill" and f not in unmet]
        mid = [f for f in soft if struck_phase(f) != "committed"]  # forward, backward, in-step (copied)
        boundary = "P?" if any(struck_phase(f) == "committed" for f in soft) else ""
        if not kills:
            if mid:
                tokens.append(f"W{{1,{len(mid)}}}" + boundary)
                rewound.append(update)
            elif boundary:
                tokens.append("P")
                preserved.append(update)
            continue
        if len(kills) > free:
            tokens.append(_interleavings(0, free, len(mid)) + "R")
            return out("killed", update)
        if any(shares_holder(a.rank, b.rank, profile) for a, b in itertools.combinations(kills, 2)):
            alternatives.append(Expectation("killed", tuple(preserved), update, False, tuple(rewound),
                                            (*tokens, _interleavings(0, len(kills) - 1, len(mid)) + "R"),
                                            tuple(replaced), tuple(unfired)))
        tokens.append(_interleavings(1, len(kills), len(mid)) + boundary)
        replaced.append(update)
        free -= len(kills)
    return out("replace" if replaced else "rewind" if rewound else "preserve", None)


def fault_schedules(updates: int = 6, max_faults: int = 10, kinds: Sequence[str] = KINDS,
                    check_kills: bool = False) -> st.SearchStrategy:
    """1..max_faults distinct faults on updates 2..updates (update 1 wires FSDP lazily).
    `check_kills` (spares): a kill may also strike at the boundary check of an update before the
    last (after the last one nobody would meet the loss), or at the save of such an update when
    one is due (every SPARES_CHECKPOINT_EVERY)."""
    phases = PHASES + ((CHECK, SAVE) if check_kills else ())
    fault = st.builds(Fault, st.integers(2, updates), st.sampled_from(phases), st.integers(0, WORLD - 1),
                      st.sampled_from(list(kinds))).filter(
        lambda f: f.phase in PHASES or (f.kind == "kill" and f.update < updates
                                        and (f.phase == CHECK or f.update % SPARES_CHECKPOINT_EVERY == 0)))
    return st.lists(fault, min_size=1, max_size=max_faults,
                    unique_by=lambda f: (f.update, f.phase, f.rank)).map(lambda fs: tuple(sorted(fs)))


# -- the effectful part -------------------------------------------------------------------------
@dataclass
class ScheduleResult:
    schedule: str
    expected: str
    observed: str
    wall_s: float
    failure: str | None = None
    #: committed-boundary recoveries no fault scheduled: a peer slower than the data timeout
    #: (2 oversubscribed cores, a cold first step after a rebind) is a real failure, recovered
    extra: int = 0
    recoveries: list[str] = field(default_factory=list)  # actions of the first attempt


def run_schedule(faults: Sequence[Fault], workdir: Path, *, updates: int = 6, data_timeout_s: float = 1.5,
                 control_timeout_s: float = 6.0, timeout_s: float = 240.0, rewind: bool = True,
                 spares: int = 0, boundary: str = "sync", profile: str = "hsdp") -> ScheduleResult:
    """Run one schedule on the real runtime; raise AssertionError when a property fails.

    `rewind`: every update runs as rt.step(fn) under an envelope qualifying Rewind for every
    uncommitted phase (the protocol is what is checked here; `accelpact qualify` measures the
    platform); False: the paper's envelope, Preserve at committed boundaries only.
    `spares`: launch 4 + S processes with ACCELPACT_SPARES=S (`run_schedule_with_spares`).
    `boundary="deferred"`: clean boundaries are agreed one step late (a checkpoint every
    DEFERRED_CHECKPOINT_EVERY updates keeps some synchronous); the prescription is that of the
    synchronous schedule it equals (`deferred_equivalent`)."""
    if spares:
        return run_schedule_with_spares(faults, workdir, spares=spares, updates=updates,
                                        data_timeout_s=data_timeout_s, control_timeout_s=control_timeout_s,
                                        timeout_s=timeout_s, profile=profile)
    if profile != "hsdp":
        raise ValueError(f"the {profile} profile needs spares (its neighbour copies serve a spare)")
    from model_checking.trace_validation import assert_valid_run

    from .drills import Drill, run_drill
    from .spawn import WorldError, run_world

    deferred = boundary == "deferred"
    if deferred and not rewind:
        raise ValueError("deferred boundaries need rt.step and Rewind qualified (fsm.deferral)")
    exp = expected_deferred(faults, updates=updates) if deferred else expected(faults, rewind=rewind)
    trace = workdir / "trace"
    drill = Drill(updates=updates, faults=plan(faults), data_timeout_s=data_timeout_s,
                  control_timeout_s=control_timeout_s, trace_dir=str(trace), boundary=boundary,
                  checkpoint_dir=str(workdir / "ckpt"), checkpoint_every=DEFERRED_CHECKPOINT_EVERY if deferred else 1,
                  restart_after_reject=True, rewind=rewind, envelope="permissive" if rewind else "builtin",
                  max_rewinds=REWIND_BUDGET)
    t0 = time.monotonic()
    observed = "?"
    extra = 0
    actions: list[list[str]] = [[]]
    try:
        results = run_world(run_drill, WORLD, drill, timeout_s=timeout_s, pg_timeout_s=30)
    except WorldError as exc:
        observed = "killed"
        assert "killed" in {exp.outcome, *(a.outcome for a in exp.alternatives)}, \
            f"expected {exp.outcome}, the world failed: {exc.reason}"
    else:
        first = [r.get("first_attempt", {"history": r["history"]})["history"] for r in results]
        actions = [[h["action"] for h in hist] for hist in first]
        if any(r.get("first_attempt") for r in results):
            observed = "reject"
        else:
            observed = "rewind" if "rewind" in actions[0] else "preserve"
        allowed = {exp.outcome} | ({"reject"} if exp.may_reject else set())
        assert observed in allowed, f"expected {exp.outcome}, observed {observed}: {actions}"
        assert len({tuple(a) for a in actions}) == 1, f"ranks disagree on the outcomes (all-or-nothing): {actions}"
        got = exp.matches(actions[0], observed=observed)
        assert got is not None, f"recoveries {actions[0]}, the envelope prescribes {list(exp.tokens)}"
        extra = got
        ends = {(r["frontier"], r["generation"]) for r in results}
        assert len(ends) == 1, f"split frontier: {ends}"
        for r in results:
            assert r["rejected"] is None, f"rank {r['rank']} still rejected: {r['rejected']}"
            assert r["frontier"] == updates
            assert r.get("mismatches") == [], f"rank {r['rank']} differs from the reference: {r.get('mismatches')}"
    assert_valid_run(trace)  # TLC: every attempt is a behaviour of the spec (no stale ref, no split F)
    return ScheduleResult(plan(faults), exp.outcome, observed, time.monotonic() - t0, extra=extra,
                          recoveries=list(actions[0]))


def run_schedule_with_spares(faults: Sequence[Fault], workdir: Path, *, spares: int, updates: int = 6,
                             data_timeout_s: float = 1.5, control_timeout_s: float = 6.0,
                             timeout_s: float = 300.0, profile: str = "hsdp") -> ScheduleResult:
    """One schedule on 4 active ranks + `spares` spare processes, launched as torchrun would (this
    process hosts the store, so every rank may be killed), every update as rt.step(fn).

    In memory (preserve, rewind, replace): every position's final holder ends at F = updates,
    one frontier and generation, bitwise equal to the uninterrupted reference, and every due
    checkpoint was published (a save a loss interrupted is owed by the new world); every killed
    rank's process died of SIGKILL and every other process exited 0. A loss that cannot be
    replaced ("killed"): every survivor rejected (exit 75) with the same recoveries. The
    recoveries fit the prescription (`expected_with_spares`); a spare's history starts at its
    arrival, so it must be a suffix of the survivors'. Traces go through TLC when no rank was
    lost (spec/AccelPact.tla has no membership change); a run with a loss has its membership
    records checked against spec/Membership.tla's rules (`model_checking.membership_trace`)."""
    from model_checking.trace_validation import assert_valid_run

    from .drills import Drill
    from .spare_drill import drill_json
    from .spares import launch_with_spares

    exp = expected(faults, rewind=True, spares=spares, profile=profile)
    trace = workdir / "trace"
    full = profile == "fsdp2-full"
    drill = Drill(updates=updates, faults=plan(faults), data_timeout_s=data_timeout_s,
                  control_timeout_s=control_timeout_s, trace_dir=str(trace), rewind=True, envelope="permissive",
                  max_rewinds=REWIND_BUDGET + spares, framework="fsdp2-full" if full else "fsdp2",
                  replicate="neighbour" if full else "off", checkpoint_dir=str(workdir / "ckpt"),
                  checkpoint_every=SPARES_CHECKPOINT_EVERY)  # saves a kill may strike (`SAVE`)
    cmd = [sys.executable, "-m", "accelpact.testing.spare_drill", "--drill", drill_json(drill), "--out", str(workdir)]
    t0 = time.monotonic()
    codes, output, _ = launch_with_spares(cmd, active=WORLD, spares=spares, log_dir=workdir, timeout_s=timeout_s,
                                          start="forkserver")
    results = {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in workdir.glob("result-*.json")}

    def explain() -> str:
        return f"exit codes {codes}\n" + "\n".join(
            f"--- launch {r} (exit {c})\n" + "\n".join(o.splitlines()[-12:]) for r, (c, o) in enumerate(zip(codes, output)))

    assert None not in codes, f"processes still running after {timeout_s:.0f} s (killed): {explain()}"
    original = [results[r] for r in sorted(results) if r < WORLD]  # positions never taken over
    assert original, f"no original rank reported: {explain()}"
    actions = [h["action"] for h in original[0]["history"]]
    for r in sorted(results):
        theirs = [h["action"] for h in results[r]["history"]]
        if r < WORLD:
            assert theirs == actions, f"ranks disagree on the outcomes (all-or-nothing): {actions} vs {theirs}"
        else:
            assert theirs == actions[len(actions) - len(theirs):], \
                f"spare {r} (rank {results[r]['position']}) recorded {theirs}, not a suffix of {actions}"
    rejected = [r for r in sorted(results) if results[r]["rejected"] is not None]
    if rejected:
        observed = "killed" if -9 in codes else "reject"
        assert len(rejected) == len(results), f"launch ranks {rejected} rejected, the others did not: {explain()}"
        assert all(c in (-9, 75) for c in codes), f"a survivor or spare did not end with the reject: {explain()}"
    else:
        observed = "replace" if "replace" in actions else "rewind" if "rewind" in actions else "preserve"
    allowed = {exp.outcome} | {e.outcome for e in exp.alternatives}
    assert observed in allowed, f"expected {exp.outcome}, observed {observed}: {actions}\n{explain()}"
    extra = exp.matches(actions, observed=observed)
    assert extra is not None, f"recoveries {actions}, the envelope prescribes {list(exp.tokens)}: {explain()}"
    if observed in IN_MEMORY:
        kills = sum(1 for f in faults if f.kind == "kill" and f not in exp.unfired)
        assert codes.count(-9) == kills, f"{kills} kill(s) prescribed, {codes.count(-9)} process(es) killed"
        assert all(c in (0, -9) for c in codes), f"a process failed: {explain()}"
        holders = sorted(results[r]["position"] for r in results)
        assert holders == list(range(WORLD)), f"positions held at the end: {holders}: {explain()}"
        ends = {(r["frontier"], r["generation"]) for r in results.values()}
        assert len(ends) == 1, f"split frontier: {ends}"
        for r in results.values():
            assert r["frontier"] == updates, f"rank {r['position']} ended at F={r['frontier']}"
            assert r.get("mismatches") == [], f"rank {r['position']} differs from the reference: {r.get('mismatches')}"
        saved = _saved_steps(trace)  # every recovery in memory keeps the checkpoints' schedule
        due = set(range(SPARES_CHECKPOINT_EVERY, updates + 1, SPARES_CHECKPOINT_EVERY))
        assert due <= saved, f"due checkpoints {sorted(due - saved)} were never published (saved: {sorted(saved)})"
    if -9 not in codes:  # a lost rank is a membership change, which the spec does not model yet
        assert_valid_run(trace)  # TLC: every attempt is a behaviour of the spec
    else:  # the membership records against spec/Membership.tla's rules
        from model_checking.membership_trace import check_membership_traces, load_membership_traces

        replicas = [[p] for p in range(WORLD)] if full else [[p for p in range(WORLD) if p % LOCAL == i]
                                                               for i in range(LOCAL)]
        copies = {p: (p + 1) % WORLD for p in range(WORLD)} if full else None
        broken = check_membership_traces(load_membership_traces(trace), replicas=replicas, copies=copies)
        assert not broken, f"the membership records break the spec's rules: {broken}"
    return ScheduleResult(plan(faults), exp.outcome, observed, time.monotonic() - t0, extra=extra, recoveries=actions)


def _saved_steps(trace: Path) -> set[int]:
    """The steps some rank traced a published save of (`checkpoint` records without an error)."""
    from ..run_report import load_traces  # skips the torn last line a killed rank may leave

    return {int(r["step"]) for recs in load_traces(trace).values() for r in recs
            if r.get("kind") == "checkpoint" and "error" not in r}


# -- hypothesis driver ----------------------------------------------------------------------------
def campaign(examples: int, *, updates: int, derandomize: bool, seed: int | None,
             summary: Path | None, kinds: Sequence[str] = KINDS, data_timeout_s: float = 1.5,
             rewind: bool = True, runner: Any = None, spares: int = 0, keep_going: bool = False,
             keep_failed: Path | None = None, boundary: str = "sync", profile: str = "hsdp") -> int:
    """Run `examples` schedules; write the summary; 0 if every property held.

    `runner` replaces `run_schedule` (tests of the driver itself: seeds, shrinking, summary).
    `spares`: every schedule runs with that many hot spares (`run_schedule_with_spares`).
    `keep_going`: a failing schedule is recorded and the campaign goes on (no shrinking), so that
    one campaign measures every schedule; `keep_failed`: a failing schedule's logs and traces are
    copied there."""
    runner = runner or run_schedule
    done: list[ScheduleResult] = []
    failures: list[dict[str, Any]] = []
    started = time.monotonic()

    def write_summary() -> None:
        if summary is None:
            return
        recoveries = Counter(a for d in done for a in d.recoveries)
        killed = sum(1 for d in done if d.observed == "killed")
        in_memory = recoveries["preserve"] + recoveries["rewind"] + recoveries["replace"]
        summary.write_text(json.dumps({
            "envelope": "rewind" if rewind else "paper (preserve at committed boundaries only)", "spares": spares,
            "boundary": boundary, "profile": profile,
            "schedules": len(done) + len(failures), "outcomes": dict(Counter(d.observed for d in done)),
            "recoveries": dict(recoveries), "killed": killed,
            # of every recovery the first attempts needed (a kill ends one with no recovery)
            "recovered_in_memory_share": round(in_memory / max(1, in_memory + recoveries["reject"] + killed), 3),
            "schedules_without_restart_share": round(
                sum(1 for d in done if d.observed in IN_MEMORY) / max(1, len(done)), 3),
            **fault_shares([(d.schedule, d.observed, d.recoveries) for d in done], rewind=rewind, spares=spares,
                           deferred_updates=updates if boundary == "deferred" else 0, profile=profile),
            "failures": failures, "seed": seed, "derandomize": derandomize,
            "wall_s": round(time.monotonic() - started, 1),
            "per_schedule_s": round(sum(d.wall_s for d in done) / max(1, len(done)), 1),
            "unscheduled_preserves": sum(d.extra for d in done),
            "results": [d.__dict__ for d in done]}, indent=2) + "\n")

    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(fault_schedules(updates=updates, kinds=kinds, check_kills=spares > 0 and "kill" in kinds))
    def one(faults):
        with tempfile.TemporaryDirectory(prefix="accelpact-campaign-") as tmp:
            try:
                res = runner(faults, Path(tmp), updates=updates, data_timeout_s=data_timeout_s, rewind=rewind,
                             **({"spares": spares} if spares else {}),
                             **({"profile": profile} if profile != "hsdp" else {}),
                             **({"boundary": boundary} if boundary != "sync" else {}))
            except AssertionError as exc:
                failures.append({"schedule": plan(faults), "error": str(exc)[:4000]})
                if keep_failed is not None:
                    kept = keep_failed / f"{len(done) + len(failures):04d}"
                    shutil.copytree(tmp, kept, dirs_exist_ok=True)
                    failures[-1]["kept"] = str(kept)
                write_summary()
                print(f"[campaign] FAIL {plan(faults)}: {str(exc).splitlines()[0][:200]}", flush=True)
                if keep_going:
                    return
                raise
        done.append(res)
        print(f"[campaign] {len(done):>4} {res.schedule:<60} {res.observed:<8} {res.wall_s:5.1f} s", flush=True)
        write_summary()

    test = one if derandomize else hyp_seed(seed)(one)
    print(f"[campaign] {examples} schedule(s), envelope {'rewind' if rewind else 'paper'}, "
          f"{f'{spares} spare(s), ' if spares else ''}{f'{boundary} boundaries, ' if boundary != 'sync' else ''}"
          f"{f'profile {profile}, ' if profile != 'hsdp' else ''}"
          f"seed {seed if not derandomize else 'derandomized'} (replay: --seed {seed})", flush=True)
    try:
        test()
    except Exception as exc:  # hypothesis re-raises the shrunk failure after printing it
        print(f"[campaign] FAILED (seed {seed}): {type(exc).__name__}: {exc}", file=sys.stderr)
        write_summary()
        return 1
    write_summary()
    if failures:
        print(f"[campaign] {len(failures)} schedule(s) FAILED of {len(done) + len(failures)} (seed {seed})",
              file=sys.stderr)
        return 1
    print(f"[campaign] ok: {len(done)} schedule(s) in {time.monotonic() - started:.0f} s", flush=True)
    return 0


def simulation_campaign(examples: int, *, seed: int | None, derandomize: bool) -> int:
    """The pure simulation property of tests/test_fsm_simulation.py (the real driver over a fake bus,
    with lost reports and votes, crashes mid-protocol, failed replace/rebind/validate) with more
    examples: the same strategy and assertions, not a copy of them."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from tests import test_fsm_simulation as sim  # type: ignore[import-not-found]

    inner = sim.test_simulated_fault_schedules_keep_every_safety_property.hypothesis.inner_test
    test = settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
                    print_blob=True, suppress_health_check=list(HealthCheck))(given(sim.schedules)(inner))
    if not derandomize:
        test = hyp_seed(seed)(test)
    started = time.monotonic()
    print(f"[simulation] {examples} schedule(s), seed {seed} (replay: --sim --seed {seed})", flush=True)
    try:
        test()
    except Exception as exc:
        print(f"[simulation] FAILED (seed {seed}): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"[simulation] ok: {examples} schedule(s) in {time.monotonic() - started:.1f} s", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accelpact.testing.campaign", description=__doc__.splitlines()[0])
    p.add_argument("--campaign", action="store_true", help="the long profile: random schedules (default: CI profile)")
    p.add_argument("--examples", type=int, default=None, help="schedules to run (CI default 2, campaign 200)")
    p.add_argument("--updates", type=int, default=6)
    p.add_argument("--seed", type=int, default=None, help="hypothesis seed (printed; replays a campaign)")
    p.add_argument("--summary", type=Path, default=None, help="write a JSON summary here")
    p.add_argument("--sim", action="store_true", help="the pure simulation campaign (thousands of schedules)")
    p.add_argument("--envelope", choices=("rewind", "paper"), default="rewind",
                   help="rewind: Rewind qualified for uncommitted phases (default); paper: Preserve only")
    p.add_argument("--spares", type=int, default=0,
                   help="launch 4 + S processes with ACCELPACT_SPARES=S: a killed rank is replaced in memory")
    p.add_argument("--boundary", choices=("sync", "deferred"), default="sync",
                   help="deferred: clean boundaries agreed one step late (Config.boundary; a checkpoint every "
                        f"{DEFERRED_CHECKPOINT_EVERY} updates keeps some synchronous)")
    p.add_argument("--profile", choices=PROFILES, default="hsdp",
                   help="hsdp: FSDP2 HSDP 2x2 (default); fsdp2-full: FSDP2 fully sharded over the 4 ranks with "
                        "neighbour copies (needs --spares)")
    p.add_argument("--keep-going", action="store_true",
                   help="record a failing schedule and go on (no shrinking): one campaign measures every schedule")
    p.add_argument("--keep-failed", type=Path, default=None, help="copy a failing schedule's logs and traces here")
    args = p.parse_args(argv)
    if args.spares and args.envelope == "paper":
        p.error("--spares needs the rewind envelope (a Replace re-runs the interrupted update)")
    if args.profile != "hsdp" and not args.spares:
        p.error(f"--profile {args.profile} needs --spares (its neighbour copies serve a spare)")
    if args.boundary == "deferred" and (args.envelope == "paper" or args.spares):
        p.error("--boundary deferred needs the rewind envelope and no spares (accelpact.fsm.deferral)")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    if args.sim:
        return simulation_campaign(args.examples or 5000, seed=seed, derandomize=not args.campaign)
    examples = args.examples or (200 if args.campaign else 2)
    return campaign(examples, updates=args.updates, derandomize=not args.campaign, seed=seed, summary=args.summary,
                    rewind=args.envelope == "rewind", spares=args.spares, keep_going=args.keep_going,
                    keep_failed=args.keep_failed, boundary=args.boundary, profile=args.profile)


if __name__ == "__main__":
    sys.exit(main())
