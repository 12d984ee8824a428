"""One recovery on this rank: the pure driver stepped against the real executor.

This is the whole glue between decide and effect: `run_recovery` yields a request, `perform`
hands it to its handler, the result goes back; time is taken per effect phase."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..fsm.driver import Observation, RecoveryOutcome, run_recovery
from ..fsm.effects import Executor, perform
from ..fsm.machine import RecoveryMachine


@dataclass
class Driven:
    outcome: RecoveryOutcome
    timings_s: dict[str, float]  # per Effect.phase
    repair_s: float  # admission → release


def drive(machine: RecoveryMachine, obs: Observation, executor: Executor) -> Driven:
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    gen = run_recovery(machine, obs)
    result: object = None
    while True:
        try:
            effect = gen.send(result)
        except StopIteration as stop:
            return Driven(stop.value, timings, time.perf_counter() - t0)
        t = time.perf_counter()
        result = perform(executor, effect)
        timings[effect.phase] = timings.get(effect.phase, 0.0) + time.perf_counter() - t
