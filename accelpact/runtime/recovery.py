"""One recovery on this rank: the pure driver stepped against the real executor.

This is the whole glue between decide and effect: `run_recovery` yields a request, `perform`
hands it to its handler, the result goes back; time is taken per effect phase."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..fsm.decisions import GroupId, applied_steps, may_rerun
from ..fsm.driver import Observation, RecoveryOutcome, run_recovery
from ..fsm.effects import Executor, failed, perform
from ..fsm.machine import RecoveryMachine
from ..fsm.phases import FailurePhase

log = logging.getLogger("accelpact.runtime")


@dataclass
class Driven:
    outcome: RecoveryOutcome
    timings_s: dict[str, float]  # per Effect.phase
    repair_s: float  # admission → release
    #: wall-clock time of the admission (time.time()): ranks are admitted at different moments,
    #: and only the ranks' admissions side by side tell the wait for the last one from the repair
    admitted_at: float = 0.0


def drive(machine: RecoveryMachine, obs: Observation, executor: Executor) -> Driven:
    t0, admitted_at = time.perf_counter(), time.time()
    timings: dict[str, float] = {}
    gen = run_recovery(machine, obs)
    result: object = None
    before = getattr(executor, "before_effect", None)  # listeners hear each step (fault drills)
    while True:
        try:
            effect = gen.send(result)
        except StopIteration as stop:
            return Driven(stop.value, timings, time.perf_counter() - t0, admitted_at)
        if before is not None:
            before(effect.phase)
        t = time.perf_counter()
        try:
            result = perform(executor, effect)
        except Exception as exc:  # a handler's own error (a user's load_state_dict, a torch assert): its vote
            log.exception("recovery step %s raised on this rank; it votes against release", effect.phase)
            result = failed(effect, f"{effect.phase} raised {type(exc).__name__}: {exc}")
        timings[effect.phase] = timings.get(effect.phase, 0.0) + time.perf_counter() - t


def observe(rt, phase: FailurePhase, saw: bool, failed: list[GroupId], cause: str,
            bug: BaseException | None) -> Observation:
    """What this rank saw, for agreement (`Runtime._recover`)."""
    if rt.hang_watch is not None:  # what it took shows the hang; from here on it would show recovery
        rt.hang_watch.freeze()
    rt.opt_step = applied_steps(rt.opt_step, rt.frontier, phase)
    facts = rt.rewind.facts(frontier=rt.frontier, update=rt.update_index, phase=phase,
                            has_data_cursor=rt.data_state is not None)
    rerun_ok, rerun_reason = may_rerun(facts)
    return Observation(
        rank=rt.rank, world_size=rt.world_size, frontier=rt.frontier, generation=rt.generation,
        opt_step=rt.opt_step, failure_phase=phase, saw_failure=saw, failed_groups=tuple(failed),
        cause=cause, preserve_qualified=rt.envelope.preserve, rewind_phases=rt.envelope.rewind_phases,
        rerun_ok=rerun_ok, rerun_reason=rerun_reason, step_copy=rt.rewind.has_step_copy(rt.frontier),
        bug=f"{type(bug).__name__}: {bug}" if bug is not None else "",
        held_groups=rt.data_plane.held(), standby=rt.data_plane.standby.tokens(),
    )
