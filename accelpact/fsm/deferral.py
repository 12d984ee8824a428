"""Whether a committed boundary may be agreed one step late (`Config.boundary = "deferred"`).

A synchronous boundary costs one control-plane all-reduce on the critical path of every update,
plus the health probe of every data-plane group: on an oversubscribed machine or a 1,000-rank
gloo ring that is the price of protection when nothing fails (`bench/guard.py`). A deferred
boundary posts the same flag without waiting and settles it before the next update makes
anything permanent (its optimizer step), so the all-reduce runs under the next forward and
backward. It is a refinement of the synchronous protocol, not a new one: until it settles the
rank has committed nothing, and if the flag says a peer needs a recovery it throws the next
update's partial work away and joins with exactly the state it had at the boundary.

That is only sound under conditions every rank evaluates alike (a per-rank choice would let a
probe collective meet a peer's training collective), decided here from facts alone:

- the update runs inside ``rt.step(fn)``: the next update can be thrown away and run again;
- Rewind is qualified for forward and backward: without the probes, a link that breaks at the
  boundary is met in the next forward or backward and must be rewound to stay in memory; the
  throw-away uses the same discard the envelope qualified;
- no pre-step copy (``step_copy``, and spares, which force it): with one, agreement could
  decide to rewind the deferred update itself, which the rank has already left;
- a data cursor (``data_state``): the thrown-away update is run again, and without its cursor
  put back it would read the next batch and the thrown-away one would be lost (a synchronous
  Rewind is refused for the same reason);
- no checkpoint due at this frontier: the save needs the commit first;
- no replica digest check due at this frontier (`Config.digest_every`): the check runs after the
  commit, with collectives and a possible Reject, which must not land inside the user's
  optimizer.step() where a deferred boundary commits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .phases import FailurePhase


@dataclass(frozen=True)
class DeferralFacts:
    """What every rank knows alike at a clean committed boundary."""

    mode: str  # Config.boundary
    in_step: bool  # the update runs inside rt.step(fn)
    rewind_phases: Collection[FailurePhase]  # the envelope's qualified Rewind phases
    step_copy: bool  # Config.step_copy (spares force it)
    has_cursor: bool  # attach was given a data_state: a re-run reads the batch it read before
    checkpoint_due: bool  # a checkpoint is saved at the frontier this boundary commits
    digest_due: bool  # the replicas compare digests at the frontier this boundary commits
    #: why this runtime refuses every Rewind although the envelope qualifies it ("": it does not):
    #: DDP buckets it could not isolate (the user's comm hook), or max_rewinds_per_update=0
    rewind_refused: str = ""
    #: why this update's boundary snapshot could not be taken ("": it was, or nothing said why):
    #: the next one will fail alike (a data cursor that cannot be copied), so nothing could be rewound
    snapshot_problem: str = ""


def why_synchronous(facts: DeferralFacts) -> str | None:
    """None: this boundary may be deferred; otherwise why it is agreed synchronously."""
    if facts.mode != "deferred":
        return "Config.boundary is sync"
    static = why_never_deferred(facts.rewind_phases, step_copy=facts.step_copy, has_cursor=facts.has_cursor,
                                rewind_refused=facts.rewind_refused)
    if static is not None:
        return static
    if not facts.in_step:
        return "the update ran in `with rt.update()`, which cannot be thrown away and run again"
    if facts.snapshot_problem:  # found by review: deferred anyway, and a broken link became a Reject
        return f"no boundary snapshot could be taken ({facts.snapshot_problem}): nothing could be rewound"
    if facts.checkpoint_due:
        return "a checkpoint is due at this frontier"
    if facts.digest_due:
        return "a replica digest check is due at this frontier"
    return None


def why_never_deferred(rewind_phases: Collection[FailurePhase], *, step_copy: bool, has_cursor: bool,
                       rewind_refused: str = "") -> str | None:
    """The part of the rule that holds for the whole run (attach says it once)."""
    missing = [p.value for p in (FailurePhase.FORWARD, FailurePhase.BACKWARD) if p not in rewind_phases]
    if missing:
        return (f"the envelope does not qualify Rewind in {', '.join(missing)}: without boundary probes a "
                "broken link is met there (run `accelpact qualify`)")
    if rewind_refused:  # a link broken at a deferred boundary is met in the next update: a Reject
        return f"this runtime cannot rewind ({rewind_refused}): the probes must find a broken link at the boundary"
    if step_copy:
        return "step_copy is on (or spares, which force it): agreement could rewind the deferred update itself"
    if not has_cursor:
        return ("no data cursor (pass data_state= to attach): the thrown-away update would read the next batch "
                "when it runs again")
    return None
