"""Check a recorded replacement run against the rules of spec/Membership.tla (issue 15).

The runtime writes one JSON-lines file per process; its membership records carry
`"kind": "membership"`, a monotonic `seq` per file, and an `event`:

    present            world, position, frontier, applied [, at_check]
    decided            world, outcome ("replace" | "shrink" | "reject"), present, lost, assign {position:
                       spare id}, source {position: source position}, frontier [, replicas]
                       [, rolled (present positions one update behind that commit the frontier)];
                       a shrink: leaving (present positions that leave), renumber {old position:
                       new position}
    rolled_forward     world (the one that failed), position, frontier (the update it commits)
    fenced             world, position
    left               world, position (a live rank whose replica group a shrink took out)
    left_world         world, position (it closed its connections of that world, now retired)
    activated          world (the new one), position, spare (the spare's id)
    world_built        world, position
    transfer_sent      world, position (the sender), to (position), bytes, digest
    transfer_verified  world, position (the receiver), digest, ok
    vote               world, position, ok
    release            world, outcome ("resume" | "reject")
    train              world, position, frontier [, world_size]

`check_membership_traces` takes the records by process (file) and returns the violations as
sentences, each starting with the rule it breaks in brackets (the spec's property where there is
one), empty when the run keeps every rule. Only the order inside one file is known (a file's
`seq`); rules that relate processes are checked on what each file holds, not on a global order:

- [OutcomeAgreement] one decision per world, one release value per world: every process that
  recorded a decision (a release) of a world recorded the same one.
- [DecisionComplete] a replace decision assigns every lost position a distinct spare and a source
  position that is present; lost and present are disjoint; a present position posted PRESENT.
- [StateFromReplica] the source of a lost position is a member of its replica set (the sets passed
  in as `replicas`, or carried by the decided record as "replicas"), or, where the decision says
  the state comes from a neighbour copy (`via`), the holder of that position's copy (`copies`:
  position -> holder, when given) that reported in its PRESENT a complete copy of it at the
  decision's frontier (a copy of another update is NoSplitFrontier's violation); a transfer is
  sent by the decision's source of its destination.
- [NoSplitFrontier] a replace decision's present reports all hold its frontier F, except the
  positions it rolls forward (`rolled`), which reported F-1 having contributed to the boundary
  check of F (`at_check`: a member was lost inside that check); a process rolls forward only
  where its decision says so, to its F, and one the decision rolls forward records it before it
  trains in the new world; a process's first train record in a replaced world is at the
  decision's frontier.
- [SpareValidatedBeforeRelease] a spare votes ok only after it verified a transfer whose digest is
  the one sent to its position in its world; a verified transfer with another digest is not ok;
  release=resume of a world only with an ok vote of every member of it.
- [TrainAfterRelease] a process trains in a world after the initial one only once it recorded
  release=resume for it, never after release=reject, and only in a world it joined.
- [FencedNeverTrains] no train record of a process after its fenced record, or after it recorded a
  decision that left its position out.
- [OnePositionOneProcess] no two processes train one position of one world; in a replaced world a
  position is trained only by its holder (the process that posted PRESENT for it, or the spare
  the decision assigned to it and that activated into it).
- A shrink (`Config.on_loss="shrink"`): [DecisionComplete] its present positions are exactly the
  ones that leave and the ones renumbered, the new numbers are 0..W'-1 in the old order;
  [LeaverNeverTrains] a process that left (or whose position the decision made leave) never
  trains again, and only a leaving position leaves; [OnePositionOneProcess] new position
  renumber[p] is trained only by the process that held p; [NoStaleAverage] a train record in the
  smaller world counts that world's size; [NoSplitFrontier] and [TrainAfterRelease] as above.
- [NoTrainOnRetiredWorld] a process that closed its connections of a world (`left_world`) never
  trains in that world again.
- [TraceFormat] seq strictly increasing in each file; the fields an event needs are there.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REQUIRED: dict[str, tuple[str, ...]] = {
    "present": ("world", "position", "frontier"),
    "decided": ("world", "outcome"),
    "fenced": ("world", "position"),
    "left": ("world", "position"),
    "left_world": ("world", "position"),
    "activated": ("world", "position", "spare"),
    "world_built": ("world", "position"),
    "transfer_sent": ("world", "position", "to", "digest"),
    "transfer_verified": ("world", "position", "digest", "ok"),
    "vote": ("world", "position", "ok"),
    "release": ("world", "outcome"),
    "train": ("world", "position", "frontier"),
    "rolled_forward": ("world", "position", "frontier"),
}


def _int_keys(mapping: Mapping[Any, Any] | None) -> dict[int, int]:
    """JSON object keys are strings: {"1": 4} -> {1: 4}."""
    return {int(k): int(v) for k, v in (mapping or {}).items()}


def _decision_key(rec: Mapping[str, Any]) -> tuple:
    return (
        rec.get("outcome"),
        tuple(sorted(int(p) for p in rec.get("present") or ())),
        tuple(sorted(int(p) for p in rec.get("lost") or ())),
        tuple(sorted(_int_keys(rec.get("assign")).items())),
        tuple(sorted(_int_keys(rec.get("source")).items())),
        rec.get("frontier"),
        tuple(sorted(int(p) for p in rec.get("leaving") or ())),
        tuple(sorted(_int_keys(rec.get("renumber")).items())),
    )


def _describe_decision(rec: Mapping[str, Any]) -> str:
    outcome, present, lost, assign, source, frontier, leaving, renumber = _decision_key(rec)
    if outcome == "shrink":
        return f"shrink (present {list(present)}, lost {list(lost)}, leaving {list(leaving)}, F={frontier})"
    if outcome != "replace":
        return f"{outcome} (present {list(present)})"
    return (f"replace (present {list(present)}, lost {list(lost)}, assign {dict(assign)}, "
            f"source {dict(source)}, F={frontier})")


def membership_records(records: Iterable[Mapping[str, Any]]) -> list[dict]:
    return [dict(r) for r in records if r.get("kind") == "membership"]


def load_membership_traces(run_dir: Path | str) -> dict[str, list[dict]]:
    """Every process's membership records in `run_dir`, keyed "<file>#<pid>".

    A rank's trace file holds every process that held that rank: a spare that took the position
    over appends to the file of the rank it replaced (and a cut-off process that wakes up may
    still be writing to it), so records are split by the pid each carries (else by the pid of the
    `attach` record before them). A torn last line (a SIGKILLed writer) is skipped."""
    out: dict[str, list[dict]] = {}
    for path in sorted(Path(run_dir).glob("*.jsonl")):
        pid = "?"
        with open(path) as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("kind") == "attach":
                    pid = str(rec.get("pid", "?"))
                elif rec.get("kind") == "membership":
                    who = str(rec.get("pid", pid))
                    out.setdefault(path.name if who == "?" else f"{path.name}#{who}", []).append(rec)
    return out


def _copy_source_violations(where: str, lost: int, source: int, frontier: Any, copies: Mapping[int, int] | None,
                            reported: set[tuple[int, int]]) -> list[str]:
    """A lost position's state from a neighbour copy: its holder, with a copy of the frontier."""
    bad = []
    if copies is not None and copies.get(lost) != source:
        bad.append(f"[StateFromReplica] {where}: lost position {lost} gets a neighbour copy from position {source}, "
                   f"but its copies go to position {copies.get(lost)}")
    if (lost, frontier) not in reported:
        held = sorted(f for i, f in reported if i == lost)
        bad.append(f"[NoSplitFrontier] {where}: lost position {lost} is replaced from position {source}'s neighbour "
                   f"copy, which reported no complete copy of it at F={frontier} (held: {held or 'none'})")
    return bad


def check_membership_traces(
    records_by_process: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    replicas: Iterable[Iterable[int]] | None = None,
    copies: Mapping[int, int] | None = None,
) -> list[str]:
    """The violations of the membership rules by a recorded run (empty: none). See the module doc."""
    bad: list[str] = []
    procs: dict[str, list[dict]] = {}

    # -- format: membership records only, seq strictly increasing per file, fields present --------
    for proc, recs in records_by_process.items():
        recs = membership_records(recs)
        last = None
        for rec in recs:
            seq = rec.get("seq")
            if not isinstance(seq, int):
                bad.append(f"[TraceFormat] {proc}: a record without an integer seq: {rec}")
            elif last is not None and seq <= last:
                bad.append(f"[TraceFormat] {proc}: seq {seq} after seq {last} (seq must increase in a file)")
            if isinstance(seq, int):
                last = seq
            event = rec.get("event")
            if event not in REQUIRED:
                bad.append(f"[TraceFormat] {proc} seq {seq}: unknown membership event {event!r}")
                continue
            missing = [f for f in REQUIRED[event] if f not in rec]
            if missing:
                bad.append(f"[TraceFormat] {proc} seq {seq}: {event} record without {', '.join(missing)}")
        procs[proc] = [r for r in recs if r.get("event") in REQUIRED and all(f in r for f in REQUIRED[r["event"]])]
    if any(m.startswith("[TraceFormat]") for m in bad):
        return bad

    given_replicas = [frozenset(int(p) for p in r) for r in replicas] if replicas is not None else None

    # -- the registers: one decision and one release value per world ------------------------------
    decisions: dict[int, tuple[str, dict]] = {}  # world -> (first process, record)
    releases: dict[int, tuple[str, str]] = {}
    for proc, recs in procs.items():
        for rec in recs:
            w = int(rec["world"])
            if rec["event"] == "decided":
                if w not in decisions:
                    decisions[w] = (proc, rec)
                elif _decision_key(decisions[w][1]) != _decision_key(rec):
                    other, first = decisions[w]
                    bad.append(f"[OutcomeAgreement] world {w}: {proc} followed the decision "
                               f"{_describe_decision(rec)} but {other} followed {_describe_decision(first)} "
                               "(one decision per world)")
            elif rec["event"] == "release":
                if w not in releases:
                    releases[w] = (proc, rec["outcome"])
                elif releases[w][1] != rec["outcome"]:
                    bad.append(f"[OutcomeAgreement] world {w}: {proc} followed release={rec['outcome']} but "
                               f"{releases[w][0]} followed release={releases[w][1]} (one release value per world)")

    # who posted PRESENT for which position of which world; who activated into which position
    presenter: dict[tuple[int, int], set[str]] = defaultdict(set)
    present_f: dict[tuple[int, int], list[int]] = defaultdict(list)
    at_check: dict[tuple[int, int], bool] = {}  # it reported its clean contribution to the check of F+1
    present_copies: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)  # the copies reported
    activated: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)  # (new world, pos) -> {proc: spare}
    for proc, recs in procs.items():
        for rec in recs:
            key = (int(rec["world"]), int(rec["position"])) if "position" in rec else None
            if rec["event"] == "present":
                presenter[key].add(proc)
                present_f[key].append(rec["frontier"])
                at_check[key] = bool(rec.get("at_check", False))
                present_copies[key] |= {(int(a), int(b)) for a, b in rec.get("copies") or ()}
            elif rec["event"] == "activated":
                activated[key][proc] = int(rec["spare"])

    # -- each replace decision: complete, sources in the replica set, one frontier ----------------
    holders: dict[int, dict[int, set[str]]] = {}  # new world -> position -> processes entitled to it
    for w, (proc, rec) in sorted(decisions.items()):
        if rec["outcome"] != "replace":
            continue
        present = {int(p) for p in rec.get("present") or ()}
        lost = {int(p) for p in rec.get("lost") or ()}
        assign, source = _int_keys(rec.get("assign")), _int_keys(rec.get("source"))
        where = f"world {w} (decided by {proc})"
        if present & lost:
            bad.append(f"[DecisionComplete] {where}: positions {sorted(present & lost)} both present and lost")
        for i in sorted(lost):
            if i not in assign:
                bad.append(f"[DecisionComplete] {where}: lost position {i} has no spare assigned")
            if i not in source:
                bad.append(f"[DecisionComplete] {where}: lost position {i} has no source")
            elif source[i] not in present:
                bad.append(f"[DecisionComplete] {where}: the source {source[i]} of lost position {i} is not present")
        spares = [assign[i] for i in lost if i in assign]
        if len(set(spares)) != len(spares):
            bad.append(f"[DecisionComplete] {where}: one spare assigned to two positions ({assign})")
        for i in sorted(present):
            if not presenter.get((w, i)):
                bad.append(f"[DecisionComplete] {where}: present position {i} has no PRESENT record")
        sets = given_replicas
        if sets is None and rec.get("replicas") is not None:
            sets = [frozenset(int(p) for p in r) for r in rec["replicas"]]
        if lost and sets is None:
            bad.append(f"[StateFromReplica] {where}: no replica sets to check the sources against "
                       "(pass replicas= or record them in the decided record)")
        elif sets is not None:
            for i in sorted(lost):
                if i in source and (rec.get("via") or {}).get(str(i)) == "neighbour":
                    bad += _copy_source_violations(where, i, source[i], rec.get("frontier"), copies,
                                                   present_copies[(w, source[i])])
                elif i in source:
                    mine = [r for r in sets if i in r]
                    if not mine or source[i] not in mine[0] or source[i] == i:
                        bad.append(f"[StateFromReplica] {where}: lost position {i} gets its state from position "
                                   f"{source[i]}, outside its replica set "
                                   f"{sorted(mine[0]) if mine else '(none)'}")
        bad += _frontier_violations(w, where, rec, present, present_f, at_check)
        new = w + 1
        holders[new] = {i: set(presenter.get((w, i), ())) for i in present}
        for i in lost:
            holders[new][i] = {p for p, s in activated.get((new, i), {}).items() if s == assign.get(i)}
        for (aw, ai), by in activated.items():
            if aw == new:
                for p, s in by.items():
                    if ai not in lost or assign.get(ai) != s:
                        bad.append(f"[OnePositionOneProcess] world {new}: {p} activated as spare {s} into position "
                                   f"{ai}, which the decision of world {w} did not assign to it")

    for w, (proc, rec) in sorted(decisions.items()):
        if rec["outcome"] == "shrink":
            bad += _shrink_decision_violations(w, proc, rec, presenter, present_f, at_check)
            holders[w + 1] = {n: set(presenter.get((w, p), ())) for p, n in _int_keys(rec.get("renumber")).items()}

    # -- transfers: sent by the source, verified against the digest sent --------------------------
    sent: dict[tuple[int, int], set[str]] = defaultdict(set)  # (new world, to) -> digests
    for proc, recs in procs.items():
        for rec in recs:
            if rec["event"] != "transfer_sent":
                continue
            w, frm, to = int(rec["world"]), int(rec["position"]), int(rec["to"])
            sent[(w, to)].add(str(rec["digest"]))
            dec = decisions.get(w - 1)
            if dec is not None and dec[1]["outcome"] == "replace":
                src = _int_keys(dec[1].get("source")).get(to)
                if src != frm:
                    bad.append(f"[StateFromReplica] world {w}: {proc} (position {frm}) sent the state of position "
                               f"{to}, whose source by the decision is {src}")

    # -- per process, in file order --------------------------------------------------------------
    trained: dict[tuple[int, int], set[str]] = defaultdict(set)
    voted_ok: dict[int, set[int]] = defaultdict(set)  # world -> positions that voted ok
    for proc, recs in procs.items():
        fenced_at: str | None = None
        left_at: int | None = None  # a shrink let this process go (LeaverNeverTrains, not fenced)
        released: dict[int, str] = {}
        joined: set[int] = set()
        verified: dict[int, bool] = {}  # world -> verified a matching digest
        is_spare_in: set[int] = set()
        first_train: set[int] = set()
        retired: set[int] = set()  # worlds whose connections this process closed
        rolled: set[int] = set()  # worlds in whose membership change this process committed an update
        for rec in recs:
            ev, w, seq = rec["event"], int(rec["world"]), rec["seq"]
            at = f"{proc} seq {seq}"
            if ev == "present":
                joined.add(w)
            elif ev == "decided":
                pos = _own_position(recs, w)
                if pos is not None and rec["outcome"] == "replace" and pos not in {int(p) for p in rec["present"]}:
                    fenced_at = fenced_at or f"its decided record (seq {seq}) left position {pos} out"
                if rec["outcome"] == "replace" and pos is not None and pos in {int(p) for p in rec["present"]}:
                    joined.add(w + 1)
                if rec["outcome"] == "shrink" and pos is not None:
                    if pos in {int(p) for p in rec.get("leaving") or ()}:
                        fenced_at = fenced_at or f"its decided record (seq {seq}) made position {pos} leave"
                        left_at = left_at or seq
                    elif pos in _int_keys(rec.get("renumber")):
                        joined.add(w + 1)
            elif ev == "fenced":
                dec = decisions.get(w)
                if dec is not None and dec[1]["outcome"] == "replace" and int(rec["position"]) in {
                        int(p) for p in dec[1]["present"]}:
                    bad.append(f"[FencedNeverTrains] {at}: fenced in world {w} although position "
                               f"{rec['position']} is in the decision's present set")
                fenced_at = fenced_at or f"its fenced record (seq {seq})"
            elif ev == "left":
                dec = decisions.get(w)
                if dec is None or dec[1]["outcome"] != "shrink" or int(rec["position"]) not in {
                        int(p) for p in dec[1].get("leaving") or ()}:
                    bad.append(f"[LeaverNeverTrains] {at}: left world {w} at position {rec['position']}, which no "
                               "shrink decision of that world made leave")
                fenced_at = fenced_at or f"its left record (seq {seq})"
                left_at = left_at or seq
            elif ev == "left_world":
                retired.add(w)
            elif ev == "rolled_forward":
                dec = decisions.get(w)
                if dec is None or int(rec["position"]) not in {int(p) for p in dec[1].get("rolled") or ()} \
                        or rec["frontier"] != dec[1].get("frontier"):
                    bad.append(f"[NoSplitFrontier] {at}: position {rec['position']} rolls forward to F={rec['frontier']} "
                               f"in world {w}, which its decision "
                               f"({_describe_decision(dec[1]) if dec else 'none recorded'}) does not say")
                rolled.add(w)
            elif ev == "activated":
                joined.add(w)
                is_spare_in.add(w)
            elif ev == "world_built":
                joined.add(w)
            elif ev == "transfer_verified":
                match = str(rec["digest"]) in sent.get((w, int(rec["position"])), set())
                if rec["ok"] and not match:
                    bad.append(f"[SpareValidatedBeforeRelease] {at}: transfer verified ok in world {w} with digest "
                               f"{rec['digest']!r}, which no transfer_sent to position {rec['position']} carried")
                verified[w] = bool(rec["ok"]) and match
            elif ev == "vote":
                if rec["ok"]:
                    voted_ok[w].add(int(rec["position"]))
                    if w in is_spare_in and not verified.get(w, False):
                        bad.append(f"[SpareValidatedBeforeRelease] {at}: the spare voted ok in world {w} before "
                                   "verifying the transfer of its state")
            elif ev == "release":
                released[w] = rec["outcome"]
            elif ev == "train":
                pos = int(rec["position"])
                if w in retired:
                    bad.append(f"[NoTrainOnRetiredWorld] {at}: trains in world {w} after closing its connections "
                               "of that world")
                if fenced_at is not None:
                    rule = "LeaverNeverTrains" if left_at is not None else "FencedNeverTrains"
                    bad.append(f"[{rule}] {at}: trains in world {w} after {fenced_at}")
                if w > 0:  # a world some membership change formed, whether or not its decision is on record
                    # (found by review: without a `decided` record these checks were skipped)
                    if released.get(w) != "resume":
                        what = "after release=reject" if released.get(w) == "reject" else "before release=resume"
                        bad.append(f"[TrainAfterRelease] {at}: trains in world {w} {what} for it")
                    if w not in joined:
                        bad.append(f"[TrainAfterRelease] {at}: trains in world {w}, which it never joined")
                    entitled = holders.get(w, {}).get(pos)
                    if entitled is not None and proc not in entitled:
                        bad.append(f"[OnePositionOneProcess] {at}: trains position {pos} in world {w}, held by "
                                   f"{sorted(entitled) or 'nobody'} by the decision of world {w - 1}")
                    dec = decisions.get(w - 1)
                    if dec is not None and dec[1]["outcome"] == "shrink" and "world_size" in rec \
                            and int(rec["world_size"]) != len(dec[1].get("renumber") or {}):
                        bad.append(f"[NoStaleAverage] {at}: trains in world {w} counting {rec['world_size']} ranks, "
                                   f"the shrink left {len(dec[1].get('renumber') or {})}")
                    if w not in first_train and dec is not None and dec[1]["outcome"] in ("replace", "shrink") \
                            and rec["frontier"] != dec[1].get("frontier"):
                        bad.append(f"[NoSplitFrontier] {at}: resumes world {w} at frontier {rec['frontier']}, "
                                   f"the decision's is {dec[1].get('frontier')}")
                    own = _own_position(recs, w - 1)
                    if w not in first_train and dec is not None and w - 1 not in rolled and own is not None \
                            and own in {int(p) for p in dec[1].get("rolled") or ()}:
                        bad.append(f"[NoSplitFrontier] {at}: trains in world {w} without committing update "
                                   f"{dec[1].get('frontier')}, which the decision of world {w - 1} rolled it forward to")
                first_train.add(w)
                trained[(w, pos)].add(proc)
    for (w, pos), who in sorted(trained.items()):
        if len(who) > 1:
            bad.append(f"[OnePositionOneProcess] world {w}: position {pos} trained by {len(who)} processes "
                       f"({', '.join(sorted(who))})")

    # -- release=resume only with every member's ok vote -----------------------------------------
    for w, (proc, outcome) in sorted(releases.items()):
        dec = decisions.get(w - 1)
        if outcome != "resume" or dec is None or dec[1]["outcome"] not in ("replace", "shrink"):
            continue
        members = {int(p) for p in dec[1]["present"]} | {int(p) for p in dec[1].get("lost") or ()}
        if dec[1]["outcome"] == "shrink":
            members = set(_int_keys(dec[1].get("renumber")).values())
        missing = sorted(members - voted_ok.get(w, set()))
        if missing:
            bad.append(f"[SpareValidatedBeforeRelease] world {w}: release=resume (recorded by {proc}) without an "
                       f"ok vote of position(s) {missing}")
    return bad


def _frontier_violations(w: int, where: str, rec: Mapping[str, Any], positions: Iterable[int], present_f: Mapping,
                         at_check: Mapping) -> list[str]:
    """[NoSplitFrontier] of one decision: each of `positions` reported its frontier F, or F-1 with
    its clean contribution to the boundary check of F where the decision rolls it forward; the
    decision rolls forward no other."""
    f = rec.get("frontier")
    rolled = {int(p) for p in rec.get("rolled") or ()}
    bad = []
    for i in sorted(positions):
        for got in present_f.get((w, i), []):
            if i in rolled and (f is None or got != f - 1 or not at_check.get((w, i), False)):
                bad.append(f"[NoSplitFrontier] {where}: position {i} is rolled forward to F={f} but reported F={got}"
                           f"{'' if at_check.get((w, i), False) else ' without a contribution to the check'}")
            elif i not in rolled and got != f:
                bad.append(f"[NoSplitFrontier] {where}: position {i} reported F={got} but the decision resumes at "
                           f"F={f}")
    return bad


def _shrink_decision_violations(w: int, proc: str, rec: Mapping[str, Any], presenter: Mapping, present_f: Mapping,
                                at_check: Mapping) -> list[str]:
    """A shrink decision is complete: present = leaving + renumbered, new numbers 0..W'-1 in the
    old order, every renumbered position posted PRESENT at the decision's frontier."""
    where = f"world {w} (decided by {proc})"
    present = {int(p) for p in rec.get("present") or ()}
    lost = {int(p) for p in rec.get("lost") or ()}
    leaving = {int(p) for p in rec.get("leaving") or ()}
    renumber = _int_keys(rec.get("renumber"))
    bad = []
    if leaving & set(renumber) or (leaving | set(renumber)) != present or lost & (leaving | set(renumber)):
        bad.append(f"[DecisionComplete] {where}: present {sorted(present)} is not the leaving {sorted(leaving)} plus "
                   f"the renumbered {sorted(renumber)}, or a lost position {sorted(lost)} stays")
    if [renumber[p] for p in sorted(renumber)] != list(range(len(renumber))):
        bad.append(f"[DecisionComplete] {where}: the renumbering {renumber} is not 0..{len(renumber) - 1} in order")
    for p in sorted(renumber):
        if not presenter.get((w, p)):
            bad.append(f"[DecisionComplete] {where}: renumbered position {p} has no PRESENT record")
    return bad + _frontier_violations(w, where, rec, sorted(renumber), present_f, at_check)


def _own_position(recs: Sequence[Mapping[str, Any]], world: int) -> int | None:
    """The position a process held in `world`: its PRESENT of that world, or its activation into it."""
    for rec in recs:
        if rec["event"] in ("present", "activated", "world_built", "train") and int(rec["world"]) == world:
            return int(rec["position"])
    return None
