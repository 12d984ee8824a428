"""Reports always fit the control plane, and one that cannot is rejected by every rank together
(never an exception before the collective, which would leave the peers waiting out the timeout)."""

from __future__ import annotations

import json

import pytest

from accelpact.control.plane import GATHER_BYTES
from accelpact.fsm.decisions import GroupId, RankReport
from accelpact.fsm.phases import FailurePhase
from accelpact.testing.spawn import run_world


def test_a_report_of_a_thousand_rank_job_fits_one_slot():
    world = tuple(range(1000))
    groups = (GroupId("replicate", world[::8]), GroupId("shard", world[:8]), GroupId("data", world))
    report = RankReport(rank=999, frontier=12345, generation=7, opt_step=12345, failure_phase=FailurePhase.BACKWARD,
                        failed_groups=groups, guard_reason="x" * 400, rerun_reason="y" * 400, held_groups=groups,
                        rewind_phases=(FailurePhase.FORWARD, FailurePhase.BACKWARD, FailurePhase.OPTIMIZER))
    payload = json.dumps(report.to_dict(), separators=(",", ":")).encode()
    assert len(payload) < (GATHER_BYTES - 4) // 2, len(payload)
    assert RankReport.from_dict(json.loads(payload)) == report
    assert GroupId.parse("replicate[0..2,5..11:2,20,21]").ranks == (0, 1, 2, 5, 7, 9, 11, 20, 21)
    with pytest.raises(ValueError, match="step"):
        GroupId.parse("replicate[0..8:0]")


def test_a_thousand_rank_report_fits_its_slot_with_the_clock_and_seal_it_travels_with():
    """What a gather really sends: the report stamped with a vector clock of one entry per rank
    (a traced run advances them every update) and sealed. A fixed 8 KiB slot overflowed at 1,000
    ranks once the clocks passed ~150,000: every recovery would have rejected."""
    from accelpact.control.auth import Sealer
    from accelpact.control.plane import slot_bytes

    world = tuple(range(1000))
    groups = (GroupId("replicate", world[::8]), GroupId("shard", world[:8]), GroupId("data", world))
    report = RankReport(rank=999, frontier=12345, generation=7, opt_step=12345, failure_phase=FailurePhase.BACKWARD,
                        failed_groups=groups, guard_reason="x" * 400, rerun_reason="y" * 400, held_groups=groups)
    for clock in (0, 10**6, 2**63 - 1):  # the largest int64 any clock entry can hold
        stamped = {"m": report.to_dict(), "vc": [clock] * len(world)}
        payload = Sealer(b"k" * 32, "attempt0/ns").seal(stamped, "report", 10**9, 999).encode()
        assert len(payload) <= slot_bytes(len(world)) - 4, (clock, len(payload))
    assert slot_bytes(2) < 8300  # small worlds keep their 8 KiB slot


def _oversize(rank: int, world_size: int) -> dict:
    import datetime

    from accelpact.control import ControlPlane
    from accelpact.fsm.effects import ControlPlaneFailure, GatherReports
    from accelpact.runtime.agree import gather_reports

    control = ControlPlane(timeout_s=10.0, attempt=0)
    report = RankReport(rank=rank, frontier=3, generation=0, opt_step=3, failure_phase=FailurePhase.COMMITTED,
                        guard_reason="z" * (GATHER_BYTES if rank == 1 else 10))  # rank 1's cannot fit
    t = datetime.datetime.now()
    got = gather_reports(control, GatherReports(report))
    waited = (datetime.datetime.now() - t).total_seconds()
    fits = gather_reports(control, GatherReports(RankReport(rank, 3, 0, 3, FailurePhase.COMMITTED)))
    control.close()
    return {"failure": got.reason if isinstance(got, ControlPlaneFailure) else None, "waited": waited,
            "next_gather_ok": not isinstance(fits, ControlPlaneFailure)}


@pytest.mark.timeout(60)
def test_an_oversized_report_makes_every_rank_fail_the_gather_together():
    for out in run_world(_oversize, 2, timeout_s=45):
        assert out["failure"] is not None and "rank 1's control-plane message of" in out["failure"], out
        assert out["waited"] < 5 and out["next_gather_ok"]  # nobody waited out the 10 s timeout
