"""Who is lost, who takes over, where its state comes from: a pure function of what the
survivors reported, so that it can be unit-tested and model-checked (spec/Membership.tla).

A lost position can be taken over only when
- a spare is free for it (spares are matched to lost positions in order, one each);
- a live replica peer holds its shard: a survivor whose replicate group contains the lost
  position (HSDP/HYBRID_SHARD: the rank with the same shard coordinate in another replica group;
  DDP: any rank) — each source is the live holder that sends the fewest shards so far (the
  lowest position among equals), so that two lost positions of one shard do not load one peer
  twice while another holder idles; or, where no replica holds it (a fully
  sharded job), a survivor holds a complete neighbour copy of it (`neighbour.py`) taken at the
  agreed frontier F whose bytes still verify — a copy of another update, or a partial one, is
  never used;
- the survivors agree on a frontier F (`agreed_frontier`): they stand at the same one, or a member
  was lost inside the boundary check of F and the survivors that never learned its outcome
  finished F and roll forward to it (they commit it in the change);
- every survivor that stands at F can re-run update F+1: the new world re-runs the update in
  flight from F (a Replace rewinds it);
- the lost rank's small state (RNG, data cursor, schedulers) of F reached the store before it
  died: it is written at each clean boundary before the rank's contribution to the check leaves;
- every survivor's recovery envelope qualifies Replace for the phase it failed in.
Where too few spares are free and every survivor runs with `on_loss="shrink"`, the job may go on
with fewer replicas instead (`shrink.plan_shrink`: the replica groups that are still whole).
Anything else rejects, with every reason, so the fail-stop evidence says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from .shrink import plan_shrink


@dataclass(frozen=True)
class Presence:
    """What one survivor posts when it finds a member missing."""

    position: int
    frontier: int
    generation: int
    #: this rank can re-run update F+1 (inside rt.step, snapshot of F, an applied step undoable)
    rerun_ok: bool
    rerun_reason: str = ""
    #: the members of this rank's replicate group (its replica peers hold the same state)
    replicas: tuple[int, ...] = ()
    #: this rank can take part in a Replace (its envelope qualifies it for its failure phase, its
    #: script made no group after attach), and why not
    replace_ok: bool = True
    replace_reason: str = ""
    #: recoveries this rank has counted, this one included: they name the control plane's
    #: recovery epochs, so a spare that joins must count on from the same number
    recoveries: int = 0
    #: (source position, frontier) of every complete neighbour copy this rank holds that verifies
    copies: tuple[tuple[int, int], ...] = ()
    #: held neighbour copies that no longer match their digest, each named
    copy_faults: tuple[str, ...] = ()
    #: the ranks that hold one whole copy of the model with this rank (its shard group; just this
    #: rank where it holds the whole model, DDP): the unit a shrink keeps or lets go
    shard_group: tuple[int, ...] = ()
    #: Config.on_loss, and whether this rank could go on in a smaller world (and why not)
    on_loss: str = "reject"
    shrink_ok: bool = False
    shrink_reason: str = ""
    #: this rank finished update F+1 (its body ran, its step is applied) and contributed a clean
    #: flag to its boundary check, but never learned the check's outcome: its state is that of F+1
    at_check: bool = False
    #: this rank met the loss in the checkpoint save due after committing F (or in the work
    #: before it): the new world owes that save
    save_interrupted: bool = False

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping) -> Presence:
        return cls(position=int(d["position"]), frontier=int(d["frontier"]), generation=int(d["generation"]),
                   rerun_ok=bool(d["rerun_ok"]), rerun_reason=str(d.get("rerun_reason", "")),
                   replicas=tuple(int(r) for r in d.get("replicas", ())), replace_ok=bool(d.get("replace_ok", True)),
                   replace_reason=str(d.get("replace_reason", "")), recoveries=int(d.get("recoveries", 0)),
                   copies=tuple((int(s), int(f)) for s, f in d.get("copies", ())),
                   copy_faults=tuple(str(x) for x in d.get("copy_faults", ())),
                   shard_group=tuple(int(r) for r in d.get("shard_group", ())), on_loss=str(d.get("on_loss", "reject")),
                   shrink_ok=bool(d.get("shrink_ok", False)), shrink_reason=str(d.get("shrink_reason", "")),
                   at_check=bool(d.get("at_check", False)),
                   save_interrupted=bool(d.get("save_interrupted", False)))


@dataclass(frozen=True)
class MembershipDecision:
    """The one value of a world's membership register."""

    world: int  # the world that failed; a Replace or a shrink builds world + 1
    outcome: str  # "replace" | "shrink" | "reject"
    present: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    #: lost position -> the spare (launch id) that takes it over
    assign: dict[int, int] = field(default_factory=dict)
    #: lost position -> the live replica peer that sends its state
    source: dict[int, int] = field(default_factory=dict)
    #: lost position -> every live holder of its shard (each posts the digest it would send)
    holders: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: lost position -> where its state comes from: "replica" (a peer's own state) or
    #: "neighbour" (a copy the lost rank sent to the source's host memory)
    via: dict[int, str] = field(default_factory=dict)
    frontier: int = 0
    generation: int = 0
    reasons: tuple[str, ...] = ()
    #: the survivors' recovery count (`Presence.recoveries`): an activated spare counts on from it
    recoveries: int = 0
    #: a shrink: the live ranks that leave with their lost replica-group peer, and the new rank of
    #: each one that goes on (old position -> position in world + 1)
    leaving: tuple[int, ...] = ()
    renumber: dict[int, int] = field(default_factory=dict)
    #: a shrink: replica groups (whole copies of the model) before and after
    replicas_before: int = 0
    replicas_after: int = 0
    #: present positions one update behind `frontier` that commit it in the change (a member was
    #: lost inside its boundary check, whose outcome they never learned)
    rolled: tuple[int, ...] = ()
    #: the checkpoint save of `frontier` was interrupted by the loss: every member of the new
    #: world takes it right after the release (the spare as well: it cannot know otherwise)
    save_owed: bool = False

    @property
    def replace(self) -> bool:
        return self.outcome == "replace"

    @property
    def shrink(self) -> bool:
        return self.outcome == "shrink"

    def fenced(self, position: int) -> bool:
        """`position`'s old holder was replaced (or its rank declared lost before a shrink): it
        must never train again. Not after a reject, which names the lost too: a rank that was only
        late then follows the reject like every rank (exit 75, restarted with the job), where a
        fenced one would end as done and its agent report success (the spec's Obey checks the
        reject first)."""
        return (self.replace or self.shrink) and position in self.lost

    def leaves(self, position: int) -> bool:
        """`position` is alive but its replica group lost a member: a shrink goes on without it."""
        return position in self.leaving

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("assign", "source", "holders", "via", "renumber"):
            d[key] = {str(k): v for k, v in d[key].items()}
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> MembershipDecision:
        return cls(world=int(d["world"]), outcome=str(d["outcome"]), present=tuple(d["present"]),
                   lost=tuple(d["lost"]), assign={int(k): int(v) for k, v in d["assign"].items()},
                   source={int(k): int(v) for k, v in d["source"].items()},
                   holders={int(k): tuple(v) for k, v in d["holders"].items()},
                   via={int(k): str(v) for k, v in d.get("via", {}).items()},
                   frontier=int(d["frontier"]), generation=int(d["generation"]), reasons=tuple(d["reasons"]),
                   recoveries=int(d.get("recoveries", 0)), leaving=tuple(d.get("leaving", ())),
                   renumber={int(k): int(v) for k, v in d.get("renumber", {}).items()},
                   replicas_before=int(d.get("replicas_before", 0)), replicas_after=int(d.get("replicas_after", 0)),
                   rolled=tuple(int(p) for p in d.get("rolled", ())), save_owed=bool(d.get("save_owed", False)))


def agreed_frontier(reports: Sequence[Presence]) -> tuple[int, tuple[int, ...], list[str]]:
    """The frontier F the new world starts from, the present positions that roll forward to it,
    and why no frontier can be agreed (then the first one, for the record).

    Equal frontiers are agreed as they are. Two consecutive ones, F-1 and F, come from a member
    lost inside the boundary check of update F: the all-reduce completed on some survivors (they
    committed F) and failed on others. A survivor at F-1 that reports `at_check` finished F and
    contributed a clean flag; its state is F's. The peers could commit only once every rank's
    contribution had arrived, and each rank writes its small state of F before its contribution
    leaves: so the lost rank's state of F is in the store too (`decide_membership` checks it). A
    survivor at F-1 without `at_check` cannot be told apart from one that did not finish F."""
    frontiers = sorted({r.frontier for r in reports})
    if len(frontiers) <= 1:
        return (frontiers[0] if frontiers else 0), (), []
    behind = [r for r in reports if r.frontier == frontiers[0]]
    if len(frontiers) == 2 and frontiers[1] == frontiers[0] + 1:
        unfinished = sorted(r.position for r in behind if not r.at_check)
        if not unfinished:
            return frontiers[1], tuple(sorted(r.position for r in behind)), []
        return frontiers[0], (), [f"survivors stand at different frontiers {frontiers}, and rank(s) {unfinished} at "
                                  f"F={frontiers[0]} did not contribute to the boundary check of update {frontiers[1]} "
                                  "(only a rank that finished it can roll forward)"]
    return frontiers[0], (), [f"survivors stand at different frontiers {frontiers}"]


def decide_membership(*, world: int, world_size: int, reports: Sequence[Presence], free_spares: Sequence[int],
                      small_state_at: Mapping[int, Collection[int]], peer_rejected: str = "",
                      spares_withheld: str = "") -> MembershipDecision:
    """The membership decision of `world` from the survivors' `reports`.

    `free_spares`: launch ids of the spares alive and not yet claimed, in the order to use them.
    `small_state_at`: lost position -> the frontiers of its small state in the store (its two
    slots; empty: none arrived). `peer_rejected`: the reason of a reject that ended the job while
    this change waited (a peer whose boundary check passed met this change inside its own
    recovery and rejected it): the positions that rejected are gone, but were never lost, and
    nothing can be rebuilt around them. `spares_withheld`: why no spare may be used (then
    `free_spares` is empty), named among the reasons of a reject."""
    present = tuple(sorted({r.position for r in reports}))
    here = set(present)
    lost = tuple(p for p in range(world_size) if p not in here)
    base = {"world": world, "present": present, "lost": lost}
    if peer_rejected:  # the absent rejected (or were lost too): none is counted lost, nothing is rebuilt
        return MembershipDecision(outcome="reject", **{**base, "lost": ()}, reasons=(
            f"the job was rejected by a peer while this membership change waited for it (positions {list(lost)} "
            f"did not post presence): {peer_rejected}",))
    # Every position present (the control plane failed on a rank while every process lived: a
    # check that broke after its contribution left, a partition that healed before the decision):
    # the same decision with nobody to replace, a world rebuilt around the same members at the
    # agreed frontier (spec/Membership.tla's `Decision` with L = {}).
    frontier, rolled, reasons = agreed_frontier(reports)
    # a save is owed only of the agreed frontier (a rank rolled forward met the loss elsewhere)
    owed = any(r.save_interrupted and r.frontier == frontier for r in reports)
    generations = sorted({r.generation for r in reports})
    if len(generations) > 1:
        reasons.append(f"survivors stand at different generations {generations}")
    for r in reports:
        if not r.rerun_ok and r.position not in rolled:  # a rank rolled forward re-runs nothing
            reasons.append(f"rank {r.position} cannot re-run the update in flight: {r.rerun_reason or 'unknown'}")
        if not r.replace_ok:
            reasons.append(f"rank {r.position} cannot take part in a Replace: {r.replace_reason or 'unknown'}")
    if len(free_spares) < len(lost) and reports and all(r.on_loss == "shrink" for r in reports):
        plan = plan_shrink(world_size=world_size, lost=lost, reports=reports)
        if plan.ok and not reasons:
            return MembershipDecision(outcome="shrink", frontier=frontier, rolled=rolled, generation=generations[0] + 1,
                                      recoveries=max(r.recoveries for r in reports), leaving=plan.leaving,
                                      renumber=plan.renumber, replicas_before=plan.replicas_before,
                                      replicas_after=plan.replicas_after, save_owed=owed, **base)
        reasons.extend(f"cannot shrink: {why}" for why in plan.reasons)
    if len(free_spares) < len(lost):
        withheld = f" ({spares_withheld})" if spares_withheld else ""
        reasons.append(f"{len(lost)} rank(s) lost ({list(lost)}) but {len(free_spares)} spare(s) free{withheld}")
    assign = dict(zip(lost, free_spares))
    holders: dict[int, tuple[int, ...]] = {}
    source: dict[int, int] = {}
    via: dict[int, str] = {}
    for p in lost:
        holders[p] = tuple(sorted({r.position for r in reports if p in r.replicas and r.position != p}))
        via[p] = "replica"
        if not holders[p]:
            holders[p] = tuple(sorted({r.position for r in reports if (p, frontier) in r.copies}))
            via[p] = "neighbour"
        if not holders[p]:
            reasons.append(_no_holder(p, frontier, reports))
            continue
        source[p] = least_loaded(holders[p], source.values())
        held = sorted(small_state_at.get(p, ()))
        if frontier not in held:
            reasons.append(f"the small state (RNG, data cursor) of lost rank {p} was not replicated at F={frontier}"
                           f" (held: {', '.join(f'F={f}' for f in held) or 'none'})")
    if reasons:
        return MembershipDecision(outcome="reject", frontier=frontier, reasons=tuple(reasons), **base)
    return MembershipDecision(outcome="replace", assign=assign, source=source, holders=holders, via=via,
                              frontier=frontier, rolled=rolled, generation=generations[0] + 1,
                              recoveries=max(r.recoveries for r in reports), save_owed=owed, **base)


def least_loaded(holders: Sequence[int], chosen: Collection[int]) -> int:
    """The holder that sends the fewest of the shards `chosen` so far (sources, one per lost
    position), the lowest among equals. Counting per holder, not by a lost position's index in
    the whole lost list: by index, HSDP 4x4 losing 0, 1 and 4 sent 0 and 4 from rank 8 while rank
    12 held the same shard and sent nothing (found by review)."""
    load = Counter(chosen)
    return min(holders, key=lambda h: (load[h], h))


def _no_holder(lost: int, frontier: int, reports: Sequence[Presence]) -> str:
    """Why nobody can send `lost`'s shard: no replica, and what neighbour copies there are."""
    held = sorted((r.position, f) for r in reports for s, f in r.copies if s == lost)
    faults = [x for r in reports for x in r.copy_faults if x.startswith(f"the copy of rank {lost} ")]
    why = (f"no live replica peer holds the shard of lost rank {lost} (its replicas are lost too, or the model "
           f"keeps a single copy of it), and no survivor holds a complete neighbour copy of it at F={frontier}")
    if held:
        why += " (copies held: " + ", ".join(f"rank {h} at F={f}" for h, f in held) + ")"
    elif not faults:
        why += " (none held: its holder is lost too, or Config.replicate is off)"
    return why + "".join(f"; {x}" for x in faults)


def failure_vote_at(failed_world: int, world_now: int, rank: int,
                    decision: MembershipDecision | None) -> tuple[int, int] | None:
    """(world, position) under which a survivor whose change failed votes against: where the
    members of the world the change builds read it. Not the failed world's key, which an earlier
    change's votes hold and nobody reads again; its number after a shrink (None: it leaves)."""
    if world_now != failed_world:  # already in the new world, renumbered if it shrank
        return world_now, rank
    if decision is not None and decision.shrink:
        new = decision.renumber.get(rank)
        return None if new is None else (failed_world + 1, new)
    return failed_world + 1, rank
