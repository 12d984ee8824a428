"""The simulator and the runtime implement one executor protocol: the same handler, with the
same effect type, for every effect the table names. A missing or misnamed handler fails here,
and an executor missing one cannot even be instantiated."""

from __future__ import annotations

import inspect
import typing

import pytest

from accelpact.fsm.effects import EFFECTS, Executor, perform
from accelpact.fsm.simulation import SimExecutor
from accelpact.runtime.executor import RecoveryExecutor


def _handler_param(cls: type, name: str):
    fn = getattr(cls, name)
    hints = typing.get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    assert len(params) == 1, f"{cls.__name__}.{name} takes {params}, expected one effect"
    return hints[params[0]], hints.get("return")


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.__name__)
def test_both_executors_implement_every_handler_with_its_effect_type(effect):
    abstract = _handler_param(Executor, effect.handler)
    assert abstract[0] is effect
    for cls in (RecoveryExecutor, SimExecutor):
        assert issubclass(cls, Executor)
        method = getattr(cls, effect.handler)
        assert not getattr(method, "__isabstractmethod__", False), f"{cls.__name__} lacks {effect.handler}"
        param, _ = _handler_param(cls, effect.handler)
        assert param is effect, f"{cls.__name__}.{effect.handler} takes {param}, expected {effect.__name__}"


def test_the_protocol_has_exactly_one_handler_per_effect():
    assert set(Executor.__abstractmethods__) == {e.handler for e in EFFECTS}


def test_an_executor_missing_a_handler_cannot_be_built():
    class Partial(Executor):
        def quiesce(self, effect):  # every other handler missing
            raise AssertionError

    with pytest.raises(TypeError, match="abstract"):
        Partial()  # type: ignore[abstract]


def test_perform_dispatches_each_effect_to_its_handler():
    calls = []

    class Recorder(Executor):
        pass

    for e in EFFECTS:
        setattr(Recorder, e.handler, lambda self, effect, _n=e.handler: calls.append((_n, type(effect))))
    Recorder.__abstractmethods__ = frozenset()
    rec = Recorder()
    samples = {
        "Quiesce": dict(), "GatherReports": dict(report=None), "RestoreBoundary": dict(frontier=1),
        "ReplaceGroups": dict(groups=(), generation=1), "RebindReferences": dict(groups=(), generation=1),
        "ValidateGroups": dict(groups=(), generation=1), "VoteRelease": dict(ok=True),
        "ForceReject": dict(reason="x"),
    }
    for e in EFFECTS:
        perform(rec, e(**samples[e.__name__]))
    assert calls == [(e.handler, e) for e in EFFECTS]
