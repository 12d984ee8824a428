"""One rank's recovery machine: the `transitions` library driven by the table in `table.py`.

The machine only decides whether a trigger is allowed; the executor (accelpact.runtime) does the
phase's work, records the result on the context, then fires the trigger that names the result.
A trigger whose conditions do not hold raises `ProtocolError` instead of silently doing nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from transitions import Machine, MachineError

from ..errors import AccelPactError
from .decisions import AgreementDecision
from .phases import Phase, RecoveryAction
from .table import TRANSITIONS, predicates

#: each phase by its name: `Phase(name)` runs the enum's lookup (several Python calls) on every
#: clean update's commit, a dict lookup is one
_PHASE_NAMED = {str(p): p for p in Phase}

#: edges `RecoveryMachine.taken` keeps (a recovery takes a few dozen; drills read them all)
EDGES_KEPT = 4096


class ProtocolError(AccelPactError, RuntimeError):
    """A trigger was fired that the transition table does not allow from the current phase."""


@dataclass(eq=False)
class RecoveryContext:
    """Plain values the table's predicates read. Set by the executor before each trigger.

    It is also the `transitions` model: the library adds `state` and the trigger methods to it.
    """

    rank: int
    decision: AgreementDecision | None = None
    replacement_ok: bool = False
    proof_ok: bool = False
    outcome: str | None = None  # the control plane's single outcome register: "resume" | "reject"

    # -- predicates named by the table (pure) -------------------------------------------------
    def decision_is_preserve(self) -> bool:
        return self.decision is not None and self.decision.action is RecoveryAction.PRESERVE

    def decision_is_rewind(self) -> bool:
        return self.decision is not None and self.decision.action is RecoveryAction.REWIND

    def decision_resumes(self) -> bool:
        return self.decision_is_preserve() or self.decision_is_rewind()

    def decision_is_reject(self) -> bool:
        return self.decision is not None and self.decision.action is RecoveryAction.REJECT

    def in_failed_group(self) -> bool:
        return self.decision is not None and self.decision.in_failed_group(self.rank)

    def replacement_built(self) -> bool:
        return self.replacement_ok

    def proof_passed(self) -> bool:
        return self.proof_ok

    def outcome_is_resume(self) -> bool:
        return self.outcome == "resume"

    def outcome_is_reject(self) -> bool:
        return self.outcome == "reject"

    def reset(self) -> None:
        self.decision = None
        self.replacement_ok = False
        self.proof_ok = False
        self.outcome = None


class RecoveryMachine:
    """The per-rank protocol machine. `fire(trigger)` or raise ProtocolError."""

    def __init__(self, ctx: RecoveryContext, on_edge: Callable[[str, str, str], None] | None = None):
        missing = [p for p in predicates() if not callable(getattr(ctx, p, None))]
        if missing:
            raise TypeError(f"RecoveryContext lacks predicates named by the table: {missing}")
        self.ctx = ctx
        self.on_edge = on_edge
        #: the newest edges taken, in order: (trigger, from, to). Bounded: a clean update fires
        #: commit_update, and a list of every edge grew by ~74 bytes per update for the life of
        #: the job (74 MB a million updates); a recovery's edges are found by `edges_since`.
        self.taken: deque[tuple[str, str, str]] = deque(maxlen=EDGES_KEPT)
        self.fired = 0  # edges taken since the machine was built (the position `edges_since` takes)
        #: (trigger, state) of the table's unconditional self-loops (commit_update in Train):
        #: taking one changes nothing but the edge log, and the table gives them no callbacks, so
        #: `fire` records them without the library's dispatch. Why: that dispatch cost ~100 µs of
        #: the training thread every clean update (measured, caches cold after the step), for an
        #: edge whose outcome is known from the table alone. Every other edge goes through it.
        self._loops = frozenset((row.trigger, str(s)) for row in TRANSITIONS for s in row.source
                                if s == row.dest and not row.conditions and not row.unless)
        self._machine = Machine(
            model=ctx,
            states=[str(p) for p in Phase],
            transitions=[
                {
                    "trigger": row.trigger,
                    "source": [str(s) for s in row.source],
                    "dest": str(row.dest),
                    "conditions": list(row.conditions),
                    "unless": list(row.unless),
                }
                for row in TRANSITIONS
            ],
            initial=str(Phase.TRAIN),
            auto_transitions=False,
            ignore_invalid_triggers=False,
        )

    @property
    def phase(self) -> Phase:
        return _PHASE_NAMED[self.ctx.state]

    def may(self, trigger: str) -> bool:
        """Whether `trigger` would be accepted now; evaluates the table's predicates, changes nothing."""
        here = self.phase
        for row in TRANSITIONS:
            if row.trigger == trigger and here in row.source:
                if all(getattr(self.ctx, c)() for c in row.conditions) and not any(
                    getattr(self.ctx, c)() for c in row.unless
                ):
                    return True
        return False

    def allowed(self) -> tuple[str, ...]:
        """Triggers accepted from the current phase under the current context."""
        return tuple(t for t in dict.fromkeys(r.trigger for r in TRANSITIONS) if self.may(t))

    def edges_since(self, mark: int) -> list[tuple[str, str, str]]:
        """The edges taken after `fired` was `mark`, in order. ProtocolError if some of them have
        already left the bounded log (more than EDGES_KEPT: no recovery takes that many)."""
        n = self.fired - mark
        if n < 0 or n > len(self.taken):
            raise ProtocolError(f"rank {self.ctx.rank}: {n} edges since mark {mark}, {len(self.taken)} kept")
        return list(self.taken)[len(self.taken) - n:]

    def fire(self, trigger: str) -> Phase:
        src = self.ctx.state
        if (trigger, src) in self._loops:
            return self._took(trigger, src, src)
        method = getattr(self.ctx, trigger, None)
        if trigger not in self._machine.events or method is None:
            raise ProtocolError(f"rank {self.ctx.rank}: unknown trigger {trigger!r}")
        try:
            moved = method()
        except MachineError as exc:
            raise ProtocolError(f"rank {self.ctx.rank}: trigger {trigger!r} not allowed from {src}") from exc
        if not moved:
            raise ProtocolError(
                f"rank {self.ctx.rank}: trigger {trigger!r} from {src} refused: its conditions do not hold"
            )
        return self._took(trigger, src, self.ctx.state)

    def _took(self, trigger: str, src: str, dst: str) -> Phase:
        edge = (trigger, src, dst)
        self.taken.append(edge)
        self.fired += 1
        if self.on_edge is not None:
            self.on_edge(*edge)
        return _PHASE_NAMED[dst]
