"""The demo trainer under the nemesis: `python -m accelpact.chaos.worker <demo_worker args>`.

It runs `accelpact.demo_worker` unchanged and adds two things around the protected run only
(the reference run is untouched):

* marks: per-rank JSON lines (`rank<r>.jsonl` in ``ACCELPACT_CHAOS_MARKS``) with the placement of
  the rank (node namespace) and, per committed boundary, when its health check ran, what failed and
  when the control-plane boundary check returned. The runtime's traces say *what* the protocol
  did; these say *when* the data plane saw the cut, which the traces do not record.
* dwell: at the updates listed in ``ACCELPACT_CHAOS_DWELL`` every rank holds for
  ``ACCELPACT_CHAOS_DWELL_S`` seconds after its optimizer step, i.e. inside the committed window
  before the boundary health check. A cut aligned to that window (see `nemesis`) then reaches the
  cross-node groups first at the boundary, not in backward: the only way to make a Preserve case
  reproducible on a machine whose update time jitters by tens of milliseconds. The dwell is a
  pause, not a change of numerics: the bitwise verdict still compares against the reference.
  With ``ACCELPACT_CHAOS_DWELL_PHASE=forward`` the ranks hold before the update's forward instead:
  forward's collectives stay inside a node (HSDP shards within a node), so an aligned cut first
  meets backward's cross-node gradient all-reduce, inside the update: the Rewind case.
  An update holds only the first time it runs in an attempt, not again when a Rewind re-runs it.

The attempt number is agreed through the job's store by `accelpact.init_process_group` (the
demo worker uses it): TORCHELASTIC_RESTART_COUNT is counted per agent and diverges across nodes
after a cut (measured here: restarted node-1 ranks then read node-0 addresses of the previous
attempt and fail with "Gloo connectFullMesh failed ... Connection refused").
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from accelpact.chaos._env import ENV_DWELL, ENV_DWELL_PHASE, ENV_DWELL_S, ENV_MARKS, ENV_NODE

#: Where the ranks hold at a dwell update: after the optimizer step, or before the forward.
DWELL_PHASES = ("committed", "forward")


def parse_dwell(raw: str) -> frozenset[int]:
    """"5,12,20" → {5, 12, 20} (update indices, 1-based)."""
    return frozenset(int(x) for x in raw.split(",") if x.strip())


class Marks:
    """Line-buffered per-rank marks; a SIGKILLed rank leaves a usable prefix."""

    def __init__(self, directory: str | None, rank: int):
        self._fh = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._fh = open(Path(directory) / f"rank{rank}.jsonl", "a", buffering=1, encoding="utf-8")
        self.rank = rank

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps({"rank": self.rank, **record}, default=str) + "\n")


def instrument(rt: Any, *, dwell: frozenset[int], dwell_s: float, marks: Marks,
               dwell_phase: str = "committed") -> None:
    """Wrap this runtime's health check and boundary check with marks, and add the dwell hook."""
    attempt = rt.attempt
    state: dict[str, Any] = {}
    health = rt.data_plane.health_check
    post, result_of = rt.control.boundary_post, rt.control.boundary_result

    def timed_health_check(listeners=()):
        state["health_in"] = time.monotonic()
        failed, causes = health(listeners)
        state["health_out"] = time.monotonic()
        state["failed"] = [g.key for g in failed]
        state["causes"] = causes
        return failed, causes

    # the boundary check is posted, then settled (at once, or one update later for a deferred
    # boundary): one mark per check, written when it settles (`boundary_check` calls both)
    def timed_post(flag: int, update_s: float | None = None):
        state["check"] = {"kind": "boundary", "attempt": attempt, "update": rt.update_index, "flag": flag,
                          "t_in": time.monotonic(), "health_in": state.pop("health_in", None),
                          "health_out": state.pop("health_out", None), "failed": state.pop("failed", []),
                          "causes": state.pop("causes", [])}
        try:
            return post(flag, update_s)
        except Exception as exc:
            marks.write({**state.pop("check"), "t_out": time.monotonic(), "error": f"{type(exc).__name__}: {exc}"[:300]})
            raise

    def timed_result(work) -> int:
        record = state.pop("check", {"kind": "boundary", "attempt": attempt, "update": rt.update_index,
                                     "t_in": time.monotonic()})
        try:
            result = result_of(work)
        except Exception as exc:
            marks.write({**record, "t_out": time.monotonic(), "error": f"{type(exc).__name__}: {exc}"[:300]})
            raise
        marks.write({**record, "t_out": time.monotonic(), "result": result})
        return result

    rt.data_plane.health_check = timed_health_check
    rt.control.boundary_post = timed_post
    rt.control.boundary_result = timed_result

    if dwell_phase not in DWELL_PHASES:
        raise ValueError(f"dwell phase must be one of {DWELL_PHASES}, got {dwell_phase!r}")
    if dwell and dwell_s > 0:
        # once per update: a Rewind runs the update again (the runtime steps update_index back),
        # and a second hold would add dwell_s to every Rewind's restore→progress
        held: set[int] = set()

        def hold() -> None:
            if rt.update_index in dwell and rt.update_index not in held:
                held.add(rt.update_index)
                marks.write({"kind": "dwell", "attempt": attempt, "update": rt.update_index,
                             "t": time.monotonic(), "dwell_s": dwell_s, "phase": dwell_phase})
                time.sleep(dwell_s)

        if dwell_phase == "forward":
            rt.model.register_forward_pre_hook(lambda module, args: hold())
        else:
            rt.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: hold())


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import accelpact
    from accelpact import demo_worker

    torch.set_num_threads(1)
    dwell = parse_dwell(os.environ.get(ENV_DWELL, ""))
    dwell_s = float(os.environ.get(ENV_DWELL_S, "0") or 0)
    dwell_phase = os.environ.get(ENV_DWELL_PHASE) or "committed"
    marks_dir = os.environ.get(ENV_MARKS)
    attach = accelpact.attach

    def attach_instrumented(*args: Any, **kwargs: Any):
        rt = attach(*args, **kwargs)
        marks = Marks(marks_dir, dist.get_rank())
        marks.write({"kind": "start", "attempt": rt.attempt, "node": os.environ.get(ENV_NODE), "pid": os.getpid(),
                     "netns": os.readlink("/proc/self/ns/net"), "t": time.monotonic(), "frontier": rt.frontier,
                     "agent_restart_count": os.environ.get("ACCELPACT_CHAOS_AGENT_RESTARTS")})
        instrument(rt, dwell=dwell, dwell_s=dwell_s, marks=marks, dwell_phase=dwell_phase)
        return rt

    accelpact.attach = attach_instrumented
    # the attempt number itself is agreed through the job's store by accelpact.init_process_group
    os.environ["ACCELPACT_CHAOS_AGENT_RESTARTS"] = str(os.environ.get("TORCHELASTIC_RESTART_COUNT"))
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:  # the launcher separates worker flags from torchrun's
        argv = argv[1:]
    return demo_worker.main(argv)


if __name__ == "__main__":
    sys.exit(main())
