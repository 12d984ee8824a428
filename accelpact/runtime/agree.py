"""GatherReports handler: every rank's report over the control plane."""

from __future__ import annotations

from ..control import ControlPlane
from ..errors import ControlPlaneError
from ..fsm.decisions import RankReport
from ..fsm.effects import ControlPlaneFailure, GatherReports


def gather_reports(control: ControlPlane, effect: GatherReports) -> list[RankReport | None] | ControlPlaneFailure:
    try:
        got = control.gather(effect.report.to_dict())
    except ControlPlaneError as exc:
        return ControlPlaneFailure(str(exc))
    unusable = control.unusable(got)
    if unusable:  # every rank saw the same placeholders: all abort together, with the reason
        return ControlPlaneFailure("; ".join(unusable))
    return [RankReport.from_dict(d) if d is not None else None for d in got]  # type: ignore[arg-type]
