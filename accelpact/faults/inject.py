"""Performing faults. Each kind is a real fault on a real group, never a simulated exception
seen only by the test: `skip` leaves a peer waiting in a collective until the group timeout,
`late` arrives after that timeout so the late rank meets a closed connection, `kill` is SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from ..errors import AccelPactError
from .plan import Fault, FaultKind

log = logging.getLogger("accelpact.faults")

#: How far past the data-plane timeout a `late` rank arrives.
LATE_MARGIN_S = 0.5
#: A `stall` lasts this many data timeouts: past the survivors' detection (a data timeout, the
#: heartbeat watch, the control timeout) and their grace for a live rank (control + 2 data + 1 s).
STALL_FACTOR = 20


class InjectedFault(AccelPactError, RuntimeError):
    """This rank skipped the rest of its update's collectives on purpose (a `skip` fault)."""

    def __init__(self, fault: Fault):
        super().__init__(f"injected fault {fault}: rank skipped its collectives")
        self.fault = fault

    @property
    def failure_cause(self) -> str:
        """How the runtime names this failure (any exception may declare one)."""
        return f"injected {self.fault}"


def perform(fault: Fault, *, data_timeout_s: float) -> None:
    """Perform a fault that strikes inside an update (forward, backward or optimizer phase)."""
    log.info("injecting %s", fault, extra={"fault": str(fault)})
    if fault.kind is FaultKind.KILL:
        kill_self()
    elif fault.kind is FaultKind.LATE:
        time.sleep(data_timeout_s + LATE_MARGIN_S)
    elif fault.kind is FaultKind.SKIP:
        raise InjectedFault(fault)
    elif fault.kind is FaultKind.STALL:
        time.sleep(STALL_FACTOR * data_timeout_s)


def kill_self() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # pragma: no cover - a closed stream: nothing to flush
            continue
    os.kill(os.getpid(), signal.SIGKILL)
