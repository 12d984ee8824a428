"""The NCCL environment an in-memory recovery needs, checked and (before init) set.

ProcessGroupNCCL reads these variables when a communicator is created, and its defaults end
the process on the first failure, before any recovery can run:

* ``TORCH_NCCL_ASYNC_ERROR_HANDLING``: 1 (TearDown) and 3 (SkipCleanUp, c10d's default) kill
  the process when the watchdog sees an error or a timeout; 0 leaves a timed-out kernel spinning,
  so a host sync behind it never returns. 2 (CleanUpOnly) aborts the communicator and keeps the
  process: the stuck kernel exits, the next call on the group raises, the recovery takes over.
* ``TORCH_NCCL_DUMP_ON_TIMEOUT``: the timeout dump (flight recorder) signals every rank through the
  store and ends in a process teardown; a recovered job must not be torn down afterwards.
* ``TORCH_NCCL_ENABLE_MONITORING``: the heartbeat monitor kills every rank once the watchdog has
  been quiet for ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (480 s) or another rank signalled a dump, which
  after a recovery it would do. AccelPact bounds its own aborts instead (`comm.device`).
* ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC``: the watchdog's wait for a dump after a failed collective
  (4x it), taken while it holds the lock every new collective on that group needs.
* ``TORCH_NCCL_BLOCKING_WAIT`` (or ``NCCL_BLOCKING_WAIT``): unset or 0; blocking waits create no
  watchdog, and the watchdog is what aborts and records a collective that failed inside an update.
* ``TORCH_NCCL_NONBLOCKING_TIMEOUT``: how long a call waits for a non-blocking communicator
  (every replacement AccelPact builds is one) to become ready; c10d's default is 30 minutes. A
  member lost after the unique-id exchange would hold the first collective on the replacement
  (the validation probe, posted before its own bound applies) that long. At most
  ``MAX_NONBLOCKING_TIMEOUT_S``; `apply_required` sets ``NONBLOCKING_TIMEOUT_S`` when unset.
* NCCL itself: ``ncclCommAbort`` hangs on 2.25.1 (pytorch#149153), fixed in 2.26.2.

Pure functions of an environment mapping and a version tuple; `accelpact.init_process_group`
applies `required_settings`, and `attach` refuses an environment that `problems` objects to.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

__all__ = ["MIN_NCCL", "REQUIRED", "Requirement", "apply_required", "nccl_version", "problems", "refuse_unfit"]

#: the first NCCL release whose ncclCommAbort does not hang (pytorch#149153)
MIN_NCCL = (2, 26, 2)


@dataclass(frozen=True)
class Requirement:
    variable: str
    value: str
    why: str


REQUIRED = (
    Requirement("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2",
                "abort a failed communicator but keep the process (1 and 3 kill it; 0 leaves kernels stuck)"),
    Requirement("TORCH_NCCL_DUMP_ON_TIMEOUT", "0",
                "a timeout dump ends in a process teardown after the recovery"),
    Requirement("TORCH_NCCL_ENABLE_MONITORING", "0",
                "the heartbeat monitor kills every rank after TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC once a "
                "communicator was aborted"),
    Requirement("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "0",
                "after a failed collective the watchdog waits 4x this for a debug dump (15 s by default: 60 s) "
                "before it aborts, holding the lock every new collective on the group takes, so the boundary's "
                "probe would wait outside any bound"),
)

#: Blocking waits (either name; ProcessGroupNCCL reads both): with them no watchdog is created, so a
#: collective that fails inside an update is never aborted and never recorded (`runtime.device_fence`)
BLOCKING_WAIT = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")
#: the values c10d's boolean parser (`getCvarBool`) reads as off; anything else is on, or malformed
#: ("" makes ProcessGroupNCCL's constructor throw)
_OFF = ("0", "n", "no", "f", "false")


def _blocking(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in _OFF

#: How long a non-blocking NCCL communicator may take to become ready (seconds): c10d reads it
#: once per process, before the data timeout is known (it may be measured at attach), so a bound
#: rather than the data timeout itself; a replacement slower than this fails its vote instead.
NONBLOCKING = "TORCH_NCCL_NONBLOCKING_TIMEOUT"
NONBLOCKING_TIMEOUT_S = 60
MAX_NONBLOCKING_TIMEOUT_S = 600


def _nonblocking_problem(value: str | None) -> str | None:
    if value is not None and value.strip().isdigit() and 1 <= int(value) <= MAX_NONBLOCKING_TIMEOUT_S:
        return None
    shown = f"{value!r}" if value is not None else "unset (c10d's default applies: 30 minutes)"
    return (f"{NONBLOCKING} is {shown}, must be whole seconds in [1, {MAX_NONBLOCKING_TIMEOUT_S}]: a member lost "
            "while a replacement communicator connects would hold its first collective that long")


def problems(env: Mapping[str, str], nccl_version: tuple[int, ...] | None) -> list[str]:
    """One line per setting that would end the process or hang a recovery, naming the variable,
    the value in effect and the value required; [] when the environment is fit."""
    found = []
    for req in REQUIRED:
        value = env.get(req.variable)
        if value is None or value.strip() != req.value:
            shown = f"{value!r}" if value is not None else "unset (c10d's default applies)"
            found.append(f"{req.variable} is {shown}, must be {req.value!r}: {req.why}")
    nonblocking = _nonblocking_problem(env.get(NONBLOCKING))
    if nonblocking is not None:
        found.append(nonblocking)
    for variable in BLOCKING_WAIT:
        value = env.get(variable)
        if _blocking(value):
            found.append(f"{variable} is {value!r}, must be unset or off ('0'): blocking waits run without the "
                         "watchdog, so a collective that fails inside an update is never aborted nor recorded")
    if nccl_version is not None and tuple(nccl_version) < MIN_NCCL:
        have, need = ".".join(map(str, nccl_version)), ".".join(map(str, MIN_NCCL))
        found.append(f"NCCL {have} is older than {need}: its ncclCommAbort can hang (pytorch#149153)")
    return found


def apply_required(env: MutableMapping[str, str]) -> list[str]:
    """Set every required variable in `env` (before the first communicator reads it); returns one
    line per change, naming the old value, so that an override of a launcher's default (torchrun
    sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1) is visible."""
    changes = []
    for req in REQUIRED:
        old = env.get(req.variable)
        if old is None or old.strip() != req.value:
            env[req.variable] = req.value
            changes.append(f"{req.variable}: {old!r} -> {req.value!r} ({req.why})")
    for variable in BLOCKING_WAIT:
        old = env.get(variable)
        if _blocking(old):
            env[variable] = "0"
            changes.append(f"{variable}: {old!r} -> '0' (blocking waits run without the watchdog)")
    old = env.get(NONBLOCKING)
    if _nonblocking_problem(old) is not None:
        env[NONBLOCKING] = str(NONBLOCKING_TIMEOUT_S)
        changes.append(f"{NONBLOCKING}: {old!r} -> '{NONBLOCKING_TIMEOUT_S}' (a replacement communicator's setup "
                       "is bounded; c10d's default waits 30 minutes)")
    return changes


def nccl_version() -> tuple[int, ...] | None:
    """The NCCL version torch was built with, or None (a CPU build, or no NCCL in it)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        # (major, minor, patch) plus a string suffix when the build has one ("2.26.2+cuda12.4")
        return tuple(int(part) for part in torch.cuda.nccl.version()[:3])
    except (ImportError, RuntimeError, AttributeError):
        return None


def refuse_unfit(env: Mapping[str, str], version: tuple[int, ...] | None) -> None:
    """Raise `ConfigError` naming every variable (and the NCCL version) an in-memory recovery
    cannot live with; `accelpact.init_process_group` sets them all before init."""
    from ..errors import ConfigError

    found = problems(env, version)
    if found:
        raise ConfigError("the NCCL environment would end the process on the first failure or hang its "
                          "recovery; use accelpact.init_process_group (it sets these before init) or set them "
                          "before torch.distributed.init_process_group:\n  " + "\n  ".join(found))
