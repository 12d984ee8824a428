"""What attach refuses, and what a failed attach leaves behind (nothing)."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re

import pytest

from accelpact.config import OTHER_PREFIXES, Config
from accelpact.errors import ConfigError
from accelpact.testing.spawn import run_world


def _ddp(group=None):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 4), process_group=group)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


class Cursor:
    def __init__(self):
        self.i = 0

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, d):
        self.i = d["i"]


def _attach_checks(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    import accelpact
    from accelpact.comm import _c10d
    from accelpact.comm.lifecycle import MembershipError, retire_group
    from accelpact.runtime import runtime as shell

    out: dict = {"rank": rank}
    cfg = Config(data_timeout_s=2.0, control_timeout_s=8.0, envelope="builtin", on_reject="raise")
    # 1. the default group is refused, with the fix named; retire_group guards it too
    model, opt = _ddp()
    try:
        accelpact.attach(model, opt, config=cfg)
    except ConfigError as exc:
        out["default"] = str(exc)
    try:
        retire_group(dist.group.WORLD)
    except MembershipError as exc:
        out["retire_default"] = str(exc)
    # 2. a data_state without state_dict is refused at attach, not at the first checkpoint
    group = dist.new_group(list(range(world_size)))
    model, opt = _ddp(group)
    try:
        accelpact.attach(model, opt, data_state=object(), config=cfg)
    except ConfigError as exc:
        out["data_state"] = str(exc)
    # 3. a failed attach undoes its side effects: timeouts, hooks, the attached mark
    before = _c10d.group_timeout(group)

    def hooks() -> tuple[int, ...]:  # the model's and the optimizer's: a dead runtime must not count steps
        return (len(model._forward_pre_hooks), len(model._forward_hooks), len(opt._optimizer_step_pre_hooks),
                len(opt._optimizer_step_post_hooks))

    hooks_before = hooks()
    real = shell.Runtime.line_up

    def failing_line_up(self):
        raise RuntimeError("peer vanished during attach")

    shell.Runtime.line_up = failing_line_up
    try:
        accelpact.attach(model, opt, data_state=Cursor(), config=cfg)
    except RuntimeError as exc:
        out["failed"] = str(exc)
    finally:
        shell.Runtime.line_up = real
    out["timeout_restored"] = _c10d.group_timeout(group) == before != datetime.timedelta(seconds=2)
    out["hooks_removed"] = hooks() == hooks_before
    # ... also when it fails after the runtime exists and its threads started (found by review: a
    # ring stride refused there left the model marked attached and the membership's threads beating)
    import importlib

    attach_module = importlib.import_module("accelpact.runtime.attach")  # the package exports the function

    real_watch = attach_module._watch_for_hangs

    def failing_watch(rt, config):
        raise ConfigError("refused after the runtime was built")

    attach_module._watch_for_hangs = failing_watch
    try:
        accelpact.attach(model, opt, data_state=Cursor(), config=cfg)
    except ConfigError as exc:
        out["late_failure"] = str(exc)
    finally:
        attach_module._watch_for_hangs = real_watch
    out["late_hooks_removed"] = hooks() == hooks_before
    out["late_unmarked"] = not getattr(model, "_accelpact_attached", False)
    # 4. one runtime per model: a second attach is refused until the first is closed
    rt = accelpact.attach(model, opt, data_state=Cursor(), config=cfg)
    out["timeout_set"] = _c10d.group_timeout(group) == datetime.timedelta(seconds=2)
    try:
        accelpact.attach(model, opt, data_state=Cursor(), config=cfg)
    except ConfigError as exc:
        out["second"] = str(exc)
    rt.close()
    out["hooks_removed_at_close"] = hooks() == hooks_before
    # the user's groups get their own timeout back (found by review: a final full-state gather
    # after close ran under the 2 s detection bound)
    out["timeout_after_close"] = _c10d.group_timeout(group) == before
    accelpact.attach(model, opt, data_state=Cursor(), config=cfg).close()
    out["reattached_after_close"] = True
    # 5. settings every rank must share, given differently (one rank's own ACCELPACT_* environment):
    #    refused on every rank before the first update, the differing rank names both values
    odd = cfg if rank == 0 else dataclasses.replace(cfg, boundary="deferred", standby_groups="off")
    try:
        accelpact.attach(model, opt, data_state=Cursor(), config=odd)
    except ConfigError as exc:
        out["differ"] = str(exc)
    accelpact.attach(model, opt, data_state=Cursor(), config=cfg).close()  # nothing left behind
    out["reattached_after_refusal"] = True
    # 6. one host given explicit timeouts, the other "auto" (which measures): refused by name before
    #    anyone measures, not met as mismatched collectives
    timed = cfg if rank == 1 else dataclasses.replace(cfg, data_timeout_s="auto", control_timeout_s="auto")
    try:
        accelpact.attach(model, opt, data_state=Cursor(), config=timed)
    except ConfigError as exc:
        out["timeouts_differ"] = str(exc)
    accelpact.attach(model, opt, data_state=Cursor(), config=cfg).close()
    return out


@pytest.mark.timeout(120)
def test_attach_refuses_bad_input_and_leaves_nothing_behind_when_it_fails():
    outs = run_world(_attach_checks, 2, timeout_s=90)
    for out in outs:
        assert "process_group=dist.new_group" in out["default"] and "default process group" in out["default"]
        assert "refusing to retire the default process group" in out["retire_default"]
        assert "has no state_dict or load_state_dict" in out["data_state"]
        assert out["failed"] == "peer vanished during attach"
        assert out["timeout_restored"] and out["hooks_removed"] and out["timeout_set"] and out["timeout_after_close"]
        assert out["late_failure"] == "refused after the runtime was built"
        assert out["late_hooks_removed"] and out["late_unmarked"] and out["hooks_removed_at_close"]
        assert "already attached" in out["second"] and out["reattached_after_close"]
        assert out["reattached_after_refusal"]
    differing, other = (out["differ"] for out in sorted(outs, key=lambda o: -o["rank"]))
    assert "rank 1 was given settings that differ from rank 0's" in differing
    assert "boundary: 'deferred' here, 'sync' on rank 0" in differing
    assert "standby_groups: 'off' here, 'gloo' on rank 0" in differing
    assert "another rank was given settings that differ" in other
    timed = {out["rank"]: out["timeouts_differ"] for out in outs}
    assert "data_timeout_s: 2.0 here, 'auto' on rank 0" in timed[1] and "settings that differ" in timed[0]


@pytest.mark.parametrize("value", [1e-9, 0.0, -1.0, float("inf"), float("nan"), 1e9])
def test_timeouts_are_bounded(value):
    with pytest.raises(ConfigError, match=r"data_timeout_s must be a number of seconds in \[0.01, 86400\]"):
        Config(data_timeout_s=value, control_timeout_s=100.0)


@pytest.mark.parametrize("field,value,message", [
    ("restore", "false", "restore must be True or False, got 'false' (str)"),  # a true string
    ("health_check", None, "health_check must be True or False, got None"),
    ("spares", "2", "spares must be an integer, got '2' (str)"),  # was a bare TypeError in validate
    ("checkpoint_keep", 1.5, "checkpoint_keep must be an integer, got 1.5"),
    ("max_restarts", None, "max_restarts must be an integer, got None"),
    ("heartbeat_s", "1", "heartbeat_s must be a number, got '1'"),
    ("metrics_port", 9400.5, "metrics_port must be an integer or None, got 9400.5"),
    ("checkpoint_key", "", "checkpoint_key is empty"),  # a secret that expanded to nothing signs nothing
])
def test_a_setting_of_the_wrong_type_is_refused_by_name(field, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config(**{field: value})


def test_an_empty_checkpoint_key_in_the_environment_is_refused_not_dropped(tmp_path):
    import pathlib

    from accelpact.checkpoint import CheckpointManager

    with pytest.raises(ConfigError, match="ACCELPACT_CHECKPOINT_KEY.*checkpoint_key is empty|checkpoint_key is empty"):
        Config().with_env({"ACCELPACT_CHECKPOINT_KEY": ""})
    with pytest.raises(ValueError, match="the checkpoint key is empty"):
        CheckpointManager(tmp_path, run_id="r", world_size=1, layout={}, key="")
    # paths may be Path objects, a key bytes
    assert Config(checkpoint_dir=pathlib.Path(tmp_path), checkpoint_key=b"k").checkpoint_key == b"k"


def test_every_variable_accelpact_reads_is_known_to_the_misspelling_check():
    """ACCELPACT_SPARE_PRELOAD (membership/warm.py) was read and documented, and every rank logged
    that it was "not an AccelPact setting and is ignored"."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "accelpact"
    read = set()
    for path in root.rglob("*.py"):
        read |= set(re.findall(r"[\"'](ACCELPACT_[A-Z0-9_]+)[\"']", path.read_text()))
    prefixed = {name for name in read if name.startswith(OTHER_PREFIXES) or name.endswith("_")}
    from accelpact.config import known_variables

    assert sorted(read - prefixed - known_variables()) == []


def test_a_misspelled_variable_is_named_with_the_closest_valid_one(caplog):
    env = {"ACCELPACT_DATA_TIMEOUT": "5", "ACCELPACT_FALUTS": "skip@2:committed:1", "ACCELPACT_CHAOS_NODE": "1",
           "ACCELPACT_STEP_COPY": "1"}
    with caplog.at_level(logging.WARNING, logger="accelpact.config"):
        cfg = Config().with_env(env)
    text = caplog.text
    assert "ACCELPACT_DATA_TIMEOUT is not an AccelPact setting" in text and "did you mean ACCELPACT_DATA_TIMEOUT_S" in text
    assert "did you mean ACCELPACT_FAULTS?" in text and "CHAOS" not in text and cfg.step_copy


def test_what_differs_is_named_with_both_values_and_a_setting_only_one_side_has():
    from accelpact.runtime.same_settings import differences

    assert differences({"a": 1, "b": "x"}, {"a": 1, "b": "x"}) == []
    assert differences({"a": 2, "c": True}, {"a": 1, "b": "x"}) == [
        "a: 2 here, 1 on rank 0", "b: (none) here, 'x' on rank 0", "c: True here, (none) on rank 0"]


def test_the_shared_settings_cover_what_changes_collectives_and_decisions_and_read_back_alike():
    import json

    from accelpact.fsm.decisions import EnvelopeFacts
    from accelpact.fsm.phases import FailurePhase
    from accelpact.runtime.same_settings import SETTINGS_BYTES, shared_settings

    envelope = EnvelopeFacts(preserve=True, rewind_phases=(FailurePhase.FORWARD,))
    got = shared_settings(Config(data_timeout_s=2.0, control_timeout_s=8.0), envelope, profile="fsdp2",
                          platform="cpu-gloo", has_data_cursor=True)
    for name in ("boundary", "standby_groups", "step_copy", "health_check", "data_timeout_s", "checkpoint_every",
                 "on_loss", "envelope", "data_state given", "restore", "checkpoint_failures_tolerated",
                 "max_restarts", "checkpoint_dir given", "checkpoint_key"):
        assert name in got
    assert json.loads(json.dumps(got)) == got and len(json.dumps(got)) < SETTINGS_BYTES
    assert "trace_dir" not in got and "metrics_port" not in got  # a rank's own: may differ
    keyed = shared_settings(Config(data_timeout_s=2.0, control_timeout_s=8.0, checkpoint_key="s3cret"), envelope,
                            profile="fsdp2", platform="cpu-gloo", has_data_cursor=True)
    other = shared_settings(Config(data_timeout_s=2.0, control_timeout_s=8.0, checkpoint_key="other"), envelope,
                            profile="fsdp2", platform="cpu-gloo", has_data_cursor=True)
    assert got["checkpoint_key"] is None and keyed["checkpoint_key"] != other["checkpoint_key"]
    assert "s3cret" not in json.dumps(keyed)  # a fingerprint, never the secret


def _too_large(rank: int, world_size: int) -> str:
    from accelpact.control import ControlPlane
    from accelpact.runtime.same_settings import SETTINGS_BYTES, check_same_settings

    control = ControlPlane(timeout_s=10.0, attempt=0)
    try:
        check_same_settings(control.group, rank, {"x": "y" * (SETTINGS_BYTES if rank == 0 else 1)})
    except ConfigError as exc:
        return str(exc)
    finally:
        control.close()
    return "not refused"


@pytest.mark.timeout(60)
def test_settings_too_large_to_compare_are_refused_by_every_rank_without_a_wait():
    """Rank 0 raising before the broadcast would leave its peers waiting in it for the timeout."""
    for out in run_world(_too_large, 2, timeout_s=45):
        assert "rank 0's settings take" in out and "more than the 4096" in out


def test_a_spare_whose_owed_save_rejects_meets_the_edge_like_its_peers(monkeypatch):
    """Found by review: the owed save's Reject left attach as a bare exception (exit 1 under
    on_reject="exit") while the survivors exited 75 through `fail_stop`."""
    import importlib
    from types import SimpleNamespace

    from accelpact.errors import RecoveryRejected
    from accelpact.runtime.runtime import Runtime

    attach_module = importlib.import_module("accelpact.runtime.attach")
    member_change = importlib.import_module("accelpact.runtime.member_change")
    after_commit = importlib.import_module("accelpact.runtime.after_commit")
    runtime_module = importlib.import_module("accelpact.runtime.runtime")
    change = SimpleNamespace(outcome="resume", reasons=[], decision=SimpleNamespace(save_owed=True), timings_s={})
    monkeypatch.setattr(member_change, "join", lambda rt, m, activation: change)
    monkeypatch.setattr(member_change, "describe", lambda change, rank: {})

    def rejecting(rt):
        raise RecoveryRejected(("the owed save failed",), rank=1)

    monkeypatch.setattr(after_commit, "take_owed_save", rejecting)
    stopped = []
    monkeypatch.setattr(runtime_module, "fail_stop", lambda exc, **kw: stopped.append((exc, kw)))
    rt = SimpleNamespace(membership=SimpleNamespace(activation=SimpleNamespace(spare=4)), prepare=lambda: None,
                         trace=SimpleNamespace(write=lambda record: None), config=SimpleNamespace(on_reject="exit"),
                         rank=1, frontier=3)
    rt._fail_stop_on_reject = lambda fn, *a, **k: Runtime._fail_stop_on_reject(rt, fn, *a, **k)
    attach_module._join(rt, None)
    assert [(exc.reasons, kw) for exc, kw in stopped] == [(("the owed save failed",), {"on_reject": "exit", "rank": 1})]


def _counted_apart(rank: int, world_size: int) -> dict:
    """Each rank's torchrun agent counted restarts apart (rank r: attempt r), under plain
    torch.distributed.init_process_group."""
    import os

    import torch.distributed as dist

    import accelpact

    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(rank)
    model, opt = _ddp(dist.new_group(list(range(world_size))))
    cfg = Config(data_timeout_s=2.0, control_timeout_s=8.0, envelope="builtin", on_reject="raise")
    rt = accelpact.attach(model, opt, data_state=Cursor(), config=cfg)
    out = {"attempt": rt.attempt, "namespace": rt.control.namespace}
    rt.close()
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_ranks_whose_agents_counted_restarts_apart_attach_under_rank_0s_attempt():
    """Found by review: each rank took its own agent's count, so the ranks built different
    control-plane namespaces and attach waited out its timeout."""
    outs = run_world(_counted_apart, 2, timeout_s=45)
    assert [o["attempt"] for o in outs] == [0, 0] and outs[0]["namespace"] == outs[1]["namespace"]

