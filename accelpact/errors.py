"""Errors and exit codes users and supervisors see.

Every exception AccelPact raises derives from :class:`AccelPactError`, so embedding code can
catch the whole library with one clause. The families below keep the builtin base their callers
have always caught (``ConfigError`` is still a ``ValueError``, ``CheckpointError`` a
``RuntimeError``...), so narrowing to them is never a breaking change.

    AccelPactError
    ├── ConfigError (ValueError)             a bad setting
    ├── UnsupportedModelError (TypeError)    attach() got a model it cannot protect
    ├── ControlPlaneError (RuntimeError)     the control plane timed out or lost a peer
    ├── RebindError                          reference discovery / rebinding (accelpact.rebind)
    ├── CheckpointError (RuntimeError)       the checkpoint layer (accelpact.checkpoint)
    ├── RestartBudgetExceeded (RuntimeError) the run used up its restarts: exit EXIT_BUDGET_EXCEEDED
    ├── RecoveryRejected                     a recovery ended in Reject: exit EXIT_REJECTED
    ├── RankFenced                           this rank was replaced while cut off: exit EXIT_FENCED
    └── SpareReleased (SystemExit)           a spare that was never needed: exit with the job's code
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXIT_BUDGET_EXCEEDED",
    "EXIT_FENCED",
    "EXIT_REJECTED",
    "AccelPactError",
    "CheckpointError",
    "ConfigError",
    "ControlPlaneError",
    "DeviceWorkFailed",
    "RebindError",
    "RankFenced",
    "RecoveryRejected",
    "SpareReleased",
    "RestartBudgetExceeded",
    "UnsupportedModelError",
]

#: Exit code of every rank when a recovery is rejected (fail-stop, L2). torchrun restarts the
#: group; the value is EX_TEMPFAIL from sysexits.h: "temporary failure, retry later".
EXIT_REJECTED = 75

#: Exit code of a rank that finds the run's restart budget used up: stop and alert, do not retry.
EXIT_BUDGET_EXCEEDED = 76

#: Exit code of a rank that learns a spare took its place (it was cut off, not dead): 0, because a
#: non-zero exit would make its torchrun agent restart it, and the rendezvous that follows would
#: restart every survivor. The process did nothing wrong; its position lives on elsewhere.
EXIT_FENCED = 0


class AccelPactError(Exception):
    """Root of every exception AccelPact raises.

    Keyword arguments are structured context (rank, group, frontier...) kept in ``context`` for
    logs and evidence records; they never change ``str(exc)``::

        raise ControlPlaneError("gather #3 failed: ...", rank=2, seq=3)
    """

    context: dict[str, Any]

    def __init__(self, *args: object, **context: Any) -> None:
        super().__init__(*args)
        self.context = dict(context)

    def __getattr__(self, name: str) -> Any:
        # A subclass whose __init__ does not reach ours still has an (empty) context.
        if name == "context":
            self.context = {}
            return self.context
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class ConfigError(AccelPactError, ValueError):
    """A bad setting: names the field (or environment variable) and what is wrong with it."""


class UnsupportedModelError(AccelPactError, TypeError):
    """attach() was handed a model AccelPact does not know how to protect."""


class ControlPlaneError(AccelPactError, RuntimeError):
    """The control plane timed out or lost a peer; the recovery must reject."""


class CollectiveAbandoned(AccelPactError, RuntimeError):
    """A wait on a gloo collective given up because a membership change abandons its world (a
    peer posted its presence): every group of that world is destroyed next, so the abandoned op
    can never pair with a later collective (`comm.backends.wait_unless`)."""

    #: a communication failure by declaration: it is raised `from None` (the poll's own "timed
    #: out" is not its cause), so no gloo text is left in its chain to say so
    failure_cause = "abandoned: a peer left this world for a membership change"


class DeviceWorkFailed(AccelPactError, RuntimeError):
    """The update's device work did not end, or NCCL recorded a failed collective during it, although
    the update's body returned: on NCCL a collective that fails raises nothing on the CPU
    (`runtime.device_fence`). A communication failure inside the update, by declaration."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.failure_cause = cause


class RebindError(AccelPactError):
    """Base class: the rebind phase cannot be trusted to leave no stale reference."""


class CheckpointError(AccelPactError, RuntimeError):
    """Base of every checkpoint-layer failure."""


class RestartBudgetExceeded(AccelPactError, RuntimeError):
    """The run has used up its restart budget: stop and alert instead of retrying forever.

    A decision to stop, not a checkpoint fault: it is not a :class:`CheckpointError`. A rank that
    meets it exits with ``exit_code`` (EXIT_BUDGET_EXCEEDED).
    """

    exit_code = EXIT_BUDGET_EXCEEDED


class RecoveryRejected(AccelPactError):
    """Raised on every rank when a recovery ends in Reject and `Config.on_reject` is "raise".

    An ordinary exception (``except Exception`` and ``except AccelPactError`` catch it); a caller
    that wants the documented fail-stop ends the process with ``exit_code`` (EXIT_REJECTED).
    ``reasons`` are the agreed reasons, ``evidence_path`` the rank's evidence record (or None).
    """

    exit_code = EXIT_REJECTED
    #: the exception the rank's own update raised when that was a bug, not a communication
    #: failure: `fail_stop` re-raises it (on_reject="raise") or prints it (before exiting)
    original: BaseException | None = None

    def __init__(self, reasons: tuple[str, ...], evidence_path: str | None = None, **context: Any) -> None:
        # args are the constructor's, so the exception pickles (spawned ranks return it).
        super().__init__(tuple(reasons), evidence_path, **context)
        self.reasons = tuple(reasons)
        self.evidence_path = evidence_path

    def __str__(self) -> str:
        return "recovery rejected: " + "; ".join(self.reasons)


class RankFenced(AccelPactError):
    """This rank was declared lost and a spare took over its position (it was cut off, not dead):
    it must never train again under its old identity. `fail_stop` ends it with EXIT_FENCED."""

    exit_code = EXIT_FENCED


class RankLeft(RankFenced):
    """This rank is alive, but its replica group lost a member and the job shrank without that
    group (`Config.on_loss="shrink"`): it holds no place in the smaller world and stops cleanly
    (EXIT_FENCED, 0: its agent must not restart it)."""


class SpareReleased(AccelPactError, SystemExit):
    """Raised by `accelpact.init_process_group` on a spare that was never needed once the job
    ends (code 0), or when the job was rejected (its code). Uncaught, it ends the script with that
    code and without a traceback, like any SystemExit; a script may catch it to clean up."""

    def __init__(self, code: int, why: str = "") -> None:
        super().__init__(code, why=why)
        self.code = code  # what the interpreter exits with (SystemExit's own init is not reached)
        self.why = why
