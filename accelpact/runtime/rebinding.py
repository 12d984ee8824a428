"""RebindReferences handler: redirect every cached reference to the replacement, then prove
that none still names the retired group (the stale-reference proof)."""

from __future__ import annotations

from ..errors import RebindError
from ..fsm.effects import RebindReferences, StepResult
from .data_plane import DataPlane
from .replace import Pending


def rebind_references(plane: DataPlane, effect: RebindReferences, pending: Pending, *, rebind: bool,
                      counts: dict[str, int]) -> StepResult:
    """`rebind=False` is the paper's causal ablation: groups are replaced, references are not."""
    try:
        for label, (old, new) in pending.items():
            if rebind:
                report = plane.plans[label].rebind(new)
                plane.plans[label].prove(old)
                for kind, n in report.counts.items():
                    counts[kind] = counts.get(kind, 0) + n
            plane.install(label, new, effect.generation, rebound=rebind)
    except (RebindError, KeyError) as exc:
        return StepResult(False, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a framework's own setter (DDP's reducer, an after-rebind action) raised:
        # the vote carries it; escaping, it would take this rank out of the protocol and leave its
        # peers waiting in validation and the vote for the control timeout
        return StepResult(False, f"rebinding failed in the framework: {type(exc).__name__}: {exc}")
    return StepResult(True)
