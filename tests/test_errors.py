"""One error hierarchy: every exception class AccelPact defines derives from AccelPactError.

The census imports every module under accelpact/ and collects every BaseException subclass whose
home is accelpact (module level, nested, or made at import time), so a new exception class added
off the hierarchy fails here, wherever it is defined.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import warnings

import pytest

import accelpact
from accelpact import errors
from accelpact.errors import (
    EXIT_BUDGET_EXCEEDED,
    EXIT_REJECTED,
    AccelPactError,
    CheckpointError,
    ConfigError,
    ControlPlaneError,
    RebindError,
    RecoveryRejected,
    RestartBudgetExceeded,
    UnsupportedModelError,
)


def _import_all() -> tuple[dict[str, object], dict[str, str]]:
    """Import every module of the package; returns (imported modules, tolerated failures).

    Skipped: `__main__` modules, whose import runs a command line. Tolerated, with a warning:
    a module whose import needs what this machine may not give (an OSError such as
    PermissionError: root, network, a device) or an optional third-party package that is not
    installed. Any other import failure, a missing accelpact module above all, fails the census:
    its classes would otherwise go unchecked.
    """
    modules: dict[str, object] = {"accelpact": accelpact}
    tolerated: dict[str, str] = {}
    failed: dict[str, str] = {}

    def record(name: str, exc: BaseException) -> None:
        missing = getattr(exc, "name", None) or ""
        optional = isinstance(exc, ModuleNotFoundError) and missing.split(".")[0] != "accelpact"
        if isinstance(exc, OSError) or optional:
            tolerated[name] = f"{type(exc).__name__}: {exc}"
        else:
            failed[name] = f"{type(exc).__name__}: {exc}"

    def on_package_error(name: str) -> None:  # walk_packages could not import a package
        try:
            importlib.import_module(name)
        except Exception as exc:
            record(name, exc)

    for info in pkgutil.walk_packages(accelpact.__path__, "accelpact.", onerror=on_package_error):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            modules[info.name] = importlib.import_module(info.name)
        except Exception as exc:
            record(info.name, exc)
    assert not failed, "modules under accelpact/ that do not import:\n" + "\n".join(
        f"  {name}: {why}" for name, why in sorted(failed.items()))
    for name, why in sorted(tolerated.items()):
        warnings.warn(f"{name} not imported here, its exception classes are unchecked: {why}", stacklevel=2)
    return modules, tolerated


def _accelpact_exception_classes(modules: dict[str, object]) -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in modules.values():
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and \
                    value.__module__.split(".")[0] == "accelpact":
                found.add(value)
    stack: list[type[BaseException]] = [BaseException]
    while stack:  # also nested classes and classes made by functions run at import
        cls = stack.pop()
        for sub in type.__subclasses__(cls):
            if sub not in found and sub.__module__.split(".")[0] == "accelpact":
                found.add(sub)
            stack.append(sub)
    return found


@pytest.fixture(scope="module")
def exception_classes() -> set[type[BaseException]]:
    modules, _ = _import_all()
    return _accelpact_exception_classes(modules)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_every_accelpact_exception_derives_from_accelpact_error(exception_classes):
    off = sorted((c for c in exception_classes if not issubclass(c, AccelPactError)), key=_name)
    assert not off, "exception classes off the AccelPactError hierarchy (derive them from AccelPactError " \
        "or one of the families in accelpact/errors.py):\n" + "\n".join(
            f"  {_name(c)}{tuple(b.__name__ for b in c.__mro__[1:])}" for c in off)


def test_census_sees_the_whole_package(exception_classes):
    # a walk that silently imported nothing would pass the test above
    names = {_name(c) for c in exception_classes}
    for expected in ("accelpact.errors.RecoveryRejected", "accelpact.checkpoint.errors.ManifestError",
                     "accelpact.rebind.errors.StaleReferenceError", "accelpact.comm.lifecycle.MembershipError",
                     "accelpact.testing.spawn.WorldError", "accelpact.chaos.topology.ChaosUnavailable"):
        assert expected in names
    assert len(exception_classes) >= 30


def test_families_keep_the_builtin_base_callers_catch():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(UnsupportedModelError, TypeError)
    assert issubclass(ControlPlaneError, RuntimeError)
    assert issubclass(CheckpointError, RuntimeError)
    assert issubclass(RestartBudgetExceeded, RuntimeError)
    from accelpact.checkpoint.errors import CheckpointExistsError, ManifestError
    from accelpact.comm.lifecycle import MembershipError

    assert issubclass(ManifestError, ValueError) and issubclass(ManifestError, CheckpointError)
    assert issubclass(CheckpointExistsError, FileExistsError) and issubclass(CheckpointExistsError, CheckpointError)
    assert issubclass(MembershipError, ValueError)
    for family in (ConfigError, UnsupportedModelError, ControlPlaneError, RebindError, CheckpointError,
                   RestartBudgetExceeded, RecoveryRejected):
        assert issubclass(family, AccelPactError)


def test_one_class_per_family_wherever_it_is_imported_from():
    from accelpact import checkpoint, control, rebind, runtime
    from accelpact.checkpoint import errors as checkpoint_errors
    from accelpact.rebind import errors as rebind_errors

    assert rebind_errors.RebindError is RebindError and rebind.RebindError is RebindError
    assert checkpoint_errors.CheckpointError is CheckpointError and checkpoint.CheckpointError is CheckpointError
    assert checkpoint.RestartBudgetExceeded is RestartBudgetExceeded
    assert control.ControlPlaneError is ControlPlaneError
    assert runtime.UnsupportedModelError is UnsupportedModelError
    for name in ("AccelPactError", "ConfigError", "UnsupportedModelError", "ControlPlaneError", "RebindError",
                 "CheckpointError", "RestartBudgetExceeded", "RecoveryRejected"):
        assert name in accelpact.__all__
        assert getattr(accelpact, name) is getattr(errors, name)


def test_recovery_rejected_is_an_ordinary_exception_with_the_exit_code():
    exc = RecoveryRejected(("peer lost", "no quorum"), "/tmp/reject-rank0-attempt0.json")
    assert not isinstance(exc, SystemExit)
    assert isinstance(exc, Exception) and isinstance(exc, AccelPactError)
    assert exc.exit_code == EXIT_REJECTED == 75
    assert exc.reasons == ("peer lost", "no quorum")
    assert exc.evidence_path == "/tmp/reject-rank0-attempt0.json"
    assert str(exc) == "recovery rejected: peer lost; no quorum"
    back = pickle.loads(pickle.dumps(exc))
    assert (back.reasons, back.evidence_path, str(back)) == (exc.reasons, exc.evidence_path, str(exc))
    with pytest.raises(AccelPactError):
        raise exc


def test_restart_budget_exceeded_carries_its_exit_code():
    assert RestartBudgetExceeded.exit_code == EXIT_BUDGET_EXCEEDED == 76
    assert not issubclass(RestartBudgetExceeded, CheckpointError)  # a decision to stop, not a fault
    from accelpact.checkpoint.attempts import check_restart_budget

    with pytest.raises(RestartBudgetExceeded) as info:
        check_restart_budget(1, attempt=2)
    assert info.value.context == {"used": 2, "max_restarts": 1, "attempt": 2, "recorded": 0}


def test_context_kwargs_are_kept_and_leave_the_message_alone():
    exc = ControlPlaneError("gather #3 failed: timeout", rank=2, group="replicate", frontier=17)
    assert str(exc) == "gather #3 failed: timeout"
    assert exc.args == ("gather #3 failed: timeout",)
    assert exc.context == {"rank": 2, "group": "replicate", "frontier": 17}
    assert AccelPactError("plain").context == {}
    back = pickle.loads(pickle.dumps(exc))
    assert (str(back), back.context) == (str(exc), exc.context)

    class NoSuper(AccelPactError):
        def __init__(self) -> None:  # does not reach AccelPactError.__init__
            pass

    assert NoSuper().context == {}


def test_structured_subclasses_fill_their_context():
    from accelpact.checkpoint.errors import CheckpointLayoutError
    from accelpact.rebind.errors import MembershipMismatchError, StaleReferenceError

    layout = CheckpointLayoutError("world changed", step=40, saved="4 ranks", current="2 ranks")
    assert layout.context == {"step": 40, "saved": "4 ranks", "current": "2 ranks"}
    assert str(layout) == "world changed"
    assert MembershipMismatchError([0, 1], None).context == {"expected": [0, 1], "actual": None}
    assert StaleReferenceError("g1", ["model.pg"]).context == {"group": "g1", "retired": None}
