"""One incident as a sentence an operator can read, built from facts alone (pure).

Both the runtime (one rank's view, every rank's gathered reports) and `accelpact report` (every
rank's trace) describe an incident with the same `IncidentFacts`, so the line a rank logs and
the line the report leads with say the same thing the same way."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..comm.classify import FailureCause
from ..fsm.decisions import GroupId

#: Cause kinds beyond the transport's: the update raised a bug, or the control plane failed.
BUG = "bug"
CONTROL_PLANE = "control_plane"
UNKNOWN = "unknown"
PEER = "peer"  # this rank only joined; agreement reports carry no cause text
CAUSE_KINDS = tuple(c.value for c in FailureCause) + (BUG, CONTROL_PLANE, UNKNOWN, PEER)

_GROUP_PREFIX = re.compile(r"^[\w.\-/]+\[[^\]]*\]:\s*")  # "label[0,2]: " before a health-check cause

#: What a rank did to a peer, by cause kind (the sentence's verb).
_VERBS = {
    FailureCause.TIMEOUT.value: "timed out waiting for {peer} on {group}",
    FailureCause.CONNECTION_CLOSED.value: "lost its link to {peer} on {group}",
    FailureCause.RETIRED_COMMUNICATOR.value: "still used a retired communicator of {group}",
}
#: The same, when no group was named (a collective inside the update raised; gloo names none).
_VERBS_NO_GROUP = {
    FailureCause.TIMEOUT.value: "timed out in a collective",
    FailureCause.CONNECTION_CLOSED.value: "lost a peer's link in a collective",
    FailureCause.RETIRED_COMMUNICATOR.value: "still used a retired communicator",
}
_OUTCOMES = {
    "preserve": "every rank preserved its state",
    "rewind": "every rank rewound",
    "replace": "a spare took the lost rank's place and every rank re-ran the update",
    "rebuild": "nobody was lost: every rank rebuilt its world around the same members and re-ran the update",
    "shrink": "the lost rank's replica group left and the whole ones re-ran the update in a smaller world",
    "reject": "every rank rejected",
}


@dataclass(frozen=True)
class IncidentFacts:
    """What the sentence says; every field is something a rank observed or the protocol decided."""

    update: int
    phase: str  # committed | forward | backward | optimizer
    action: str  # preserve | rewind | reject
    observers: tuple[int, ...]  # ranks that saw the failure themselves, first observer first
    failed_groups: tuple[str, ...]
    cause: str  # the first observer's cause, as classified ("" if none)
    detect_s: float
    repair_s: float
    reasons: tuple[str, ...] = ()
    generation_after: int | None = None
    back_s: float | None = None  # fault → first commit past the failed update (report only)
    restored_step: int | None = None  # the checkpoint a restart resumed from (report only)
    #: a Replace with nobody to replace (`member_change`: the control plane failed with every rank alive)
    nobody_lost: bool = False


def cause_kind(cause: str, *, bug: str = "") -> str:
    """The kind of a classified cause line: "replicate[0,2]: timeout: ..." → "timeout".

    Causes are written by the data plane as "<group key>: <kind>: <message>" (health check) or
    "<kind>: <message>" (an exception in the update); several are joined by "; "."""
    if bug:
        return BUG
    if cause.startswith("control plane"):
        return CONTROL_PLANE
    for part in cause.split("; "):
        token = _GROUP_PREFIX.sub("", part.strip()).split(":", 1)[0].strip()
        if token in CAUSE_KINDS:
            return token
    return UNKNOWN


def observers_of(reports: Sequence[Mapping | None]) -> list[int]:
    """Ranks whose gathered report shows they saw the failure themselves (a failed group, a
    failure inside the update, or a bug), rather than joining through the control plane."""
    return [r["rank"] for r in reports if r is not None and (
        r.get("failed_groups") or r.get("failure_phase", "committed") != "committed" or r.get("bug"))]


def members(group_key: str) -> tuple[int, ...]:
    try:
        return GroupId.parse(group_key).ranks
    except ValueError:
        return ()


def peers_of(rank: int, failed_groups: Iterable[str], observers: Iterable[int]) -> list[int]:
    """Who `rank` lost: members of its failed groups that did not see the failure (the silent
    ones are the suspects); if every member saw it, every other member."""
    groups = [members(g) for g in failed_groups if rank in members(g)] or [members(g) for g in failed_groups]
    mates = sorted({r for g in groups for r in g if r != rank})
    saw = set(observers)
    silent = [r for r in mates if r not in saw]
    return silent or mates


def _ranks(ranks: Sequence[int]) -> str:
    if not ranks:
        return "a peer"
    names = [str(r) for r in ranks]
    return ("rank " if len(names) == 1 else "ranks ") + (", ".join(names[:-1]) + " and " + names[-1]
                                                         if len(names) > 1 else names[0])


def _what(f: IncidentFacts) -> str:
    kind = cause_kind(f.cause)
    if not f.observers:
        return f"the control plane reported a failure ({_short(f.cause or '; '.join(f.reasons))})"
    first = f.observers[0]
    group = next((g for g in f.failed_groups if first in members(g)), f.failed_groups[0] if f.failed_groups else "")
    if kind == BUG or (not group and kind not in _VERBS):
        return f"rank {first} failed: {_short(f.cause or '; '.join(f.reasons))}"
    if not group:
        return f"rank {first} {_VERBS_NO_GROUP[kind]}"
    verb = _VERBS.get(kind, "lost contact with {peer} on {group}" + (f" ({kind})" if kind == "other" else ""))
    peer = _ranks(peers_of(first, f.failed_groups, f.observers))
    return f"rank {first} " + verb.format(peer=peer, group=group or "a data-plane group", cause=kind)


def _when(f: IncidentFacts) -> str:
    if f.phase == "committed":
        return f"at the committed boundary of update {f.update}"
    return f"during {'the optimizer step' if f.phase == 'optimizer' else f.phase} of update {f.update}"


def nobody_lost(replacement: Mapping | None) -> bool:
    """A Replace's record (`member_change.describe`) that replaced nobody: the world was rebuilt."""
    return replacement is not None and not replacement.get("lost")


def _outcome(f: IncidentFacts) -> str:
    action = "rebuild" if f.action == "replace" and f.nobody_lost else f.action
    out = _OUTCOMES.get(action, f"every rank decided {f.action}")
    if f.action == "reject" and f.reasons:
        out += f" ({_short(f.reasons[0])})"
    if f.action == "reject" and f.restored_step is not None:
        out += f", restarted from checkpoint {f.restored_step}"
    return out


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sentence(f: IncidentFacts) -> str:
    """E.g. "rank 0 timed out waiting for rank 2 on replicate[0,2] at the committed boundary of
    update 3; every rank preserved its state; detected in 2.00 s, repaired in 25 ms"."""
    others = list(f.observers[1:])
    also = f" (also seen by {_ranks(others)})" if others else ""
    times = f"detected in {f.detect_s:.2f} s, repaired in {f.repair_s * 1e3:.0f} ms"
    if f.back_s is not None:
        times += f", training past it {f.back_s:.2f} s after the fault"
    return f"{_what(f)}{also} {_when(f)}; {_outcome(f)}; {times}"
