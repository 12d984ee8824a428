"""The recovery protocol as data: one row per transition, read like DESIGN.md section 2.

This table is the source of truth. The `transitions` machine in `machine.py` is built from it,
the TLA+ spec in `spec/AccelPact.tla` names one action per trigger, and
`tests/test_conformance.py` proves that the spec's (action, from, to) edges equal `edges()`.

Conditions and `unless` entries name predicates of `RecoveryContext` (see `machine.py`); each is a
pure function of values the executor has already gathered. `effects` names the `Effect` classes
(`effects.py`) the executor may be asked to perform after the row is taken and before the next
one, in that order; the driver refuses any other request (ProtocolError), and
`tests/test_fsm_simulation.py` proves that simulation requests exactly these. The table itself
performs no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .phases import Phase

P = Phase


@dataclass(frozen=True)
class Row:
    trigger: str
    source: tuple[Phase, ...]
    dest: Phase
    conditions: tuple[str, ...] = field(default=())
    unless: tuple[str, ...] = field(default=())
    effects: tuple[str, ...] = field(default=())
    why: str = ""


def _row(trigger, source, dest, conditions=(), unless=(), effects=(), why=""):
    src = tuple(source) if isinstance(source, (list, tuple)) else (source,)
    return Row(trigger, src, dest, tuple(conditions), tuple(unless), tuple(effects), why)


#: What a rank does once it stands in Validate: vote, and force the register to reject if the
#: control plane fails while it waits for the release.
_VOTE = ("VoteRelease", "ForceReject")


# fmt: off
TRANSITIONS: tuple[Row, ...] = (
    # -- training ------------------------------------------------------------------------------
    _row("commit_update",   P.TRAIN,    P.TRAIN,
         why="an update's boundary guard passed: F := F + 1"),
    # -- observe -------------------------------------------------------------------------------
    _row("observe_failure", P.TRAIN,    P.OBSERVE,
         why="this rank saw a data-plane failure; classify cause and failure phase"),
    _row("join_recovery",   P.TRAIN,    P.OBSERVE,
         why="a peer raised the recovery flag at the boundary check"),
    # -- guard ---------------------------------------------------------------------------------
    _row("enter_guard",     P.OBSERVE,  P.GUARD,    effects=["Quiesce"],
         why="flush device work, check FSDP units idle and no outstanding gradients"),
    _row("submit_report",   P.GUARD,    P.AGREE,    effects=["GatherReports", "ForceReject"],
         why="post (F, g, tau, phi, failed groups, guard verdict) on the control plane"),
    # -- frontier agreement --------------------------------------------------------------------
    _row("decide_preserve", P.AGREE,    P.REPLACE,  conditions=["decision_is_preserve", "in_failed_group"],
         effects=["ReplaceGroups"], why="all committed, F and g agree; this rank owns a failed group"),
    _row("decide_rewind",   P.AGREE,    P.REPLACE,  conditions=["decision_is_rewind"],
         effects=["RestoreBoundary", "ReplaceGroups"],
         why="an interrupted update, every rank at tau = F or holding a pre-step copy of its applied step: "
             "every rank discards it (undoing that step), restores the boundary snapshot and rebuilds every "
             "group it holds (even a rank that holds none must restore)"),
    _row("stand_by",        P.AGREE,    P.VALIDATE, conditions=["decision_is_preserve"],
         unless=["in_failed_group"], effects=_VOTE,
         why="preserve agreed, but no failed group has this rank: wait for release. Never under Rewind: "
             "a rank standing by would keep its interrupted step and its old groups"),
    _row("decide_reject",   P.AGREE,    P.REJECT,   conditions=["decision_is_reject"],
         effects=["ForceReject"], why="any mismatch, unqualified action, guard failure or missing report: "
                                      "write reject into the outcome register"),
    # -- replace -------------------------------------------------------------------------------
    _row("replace_comm",    P.REPLACE,  P.REBIND,   conditions=["replacement_built"],
         effects=["RebindReferences"], why="identical-membership group built at generation g+1"),
    _row("replace_failed",  P.REPLACE,  P.VALIDATE, unless=["replacement_built"],
         effects=_VOTE, why="the replacement could not be built: vote against release"),
    # -- rebind --------------------------------------------------------------------------------
    _row("rebind_refs",     P.REBIND,   P.VALIDATE, conditions=["proof_passed"],
         effects=["ValidateGroups", *_VOTE],
         why="every cached reference names g+1; none names a retired group: validate, then vote"),
    _row("rebind_failed",   P.REBIND,   P.VALIDATE, unless=["proof_passed"],
         effects=_VOTE, why="a stale reference survived: vote against release"),
    # -- validate and release ------------------------------------------------------------------
    _row("release",         P.VALIDATE, P.RESUME,   conditions=["outcome_is_resume", "decision_is_preserve"],
         why="every rank validated; the single release decision is resume"),
    _row("rewind",          P.VALIDATE, P.RESUME,   conditions=["outcome_is_resume", "decision_is_rewind"],
         why="every rank validated; resume at F and re-run the interrupted update F+1"),
    _row("release_reject",  P.VALIDATE, P.REJECT,   conditions=["outcome_is_reject"],
         why="a rank voted against release; all reject together"),
    _row("abort",           P.AGREE,    P.REJECT,   conditions=["outcome_is_reject"],
         why="the control plane failed while gathering reports (timeout, a peer crashed): the one "
             "outcome register was set to reject. The only phase that waits on the control plane "
             "before Validate; replace waits on peers through the store and fails into Validate"),
    _row("resume_training", P.RESUME,   P.TRAIN,
         why="continue training at the agreed frontier with generation g+1 (after a rewind: re-run F+1)"),
)
# fmt: on


def edges() -> frozenset[tuple[str, str, str]]:
    """Every (trigger, from-phase, to-phase) edge of the table."""
    return frozenset(
        (row.trigger, str(src), str(row.dest)) for row in TRANSITIONS for src in row.source
    )


def effects_of(trigger: str) -> tuple[str, ...]:
    """The effects the row of `trigger` names (none for an unknown trigger)."""
    for row in TRANSITIONS:
        if row.trigger == trigger:
            return row.effects
    return ()


def triggers() -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for row in TRANSITIONS:
        seen.setdefault(row.trigger, None)
    return tuple(seen)


def predicates() -> frozenset[str]:
    """Every predicate name the table refers to (each must exist on RecoveryContext)."""
    return frozenset(name for row in TRANSITIONS for name in (*row.conditions, *row.unless))


def render_markdown() -> str:
    """The table as markdown, for the README and `accelpact check --table`."""
    lines = [
        "| trigger | from | to | when | unless | effects |",
        "|---|---|---|---|---|---|",
    ]
    for row in TRANSITIONS:
        lines.append(
            f"| {row.trigger} | {', '.join(map(str, row.source))} | {row.dest} | "
            f"{', '.join(row.conditions) or '-'} | {', '.join(row.unless) or '-'} | {', '.join(row.effects) or '-'} |"
        )
    return "\n".join(lines)
