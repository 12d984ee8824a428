"""Lifecycle rules that need no peers: names, prefixes, timeouts, refusals, idempotent retirement."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from accelpact.comm import (
    MembershipError,
    group_name,
    make_group,
    parse_group_name,
    replace_group,
    retire_group,
    retired_group_names,
    store_prefix,
)
from accelpact.comm.lifecycle import as_timedelta

pytestmark = pytest.mark.usefixtures("fake_world")  # tests/conftest.py: a 4-rank fake world


def test_names_and_prefixes_are_deterministic_and_world_unique():
    assert group_name("replicate", 3) == "accelpact:replicate:g3"
    assert parse_group_name("accelpact:replicate:g3") == ("replicate", 3)
    assert parse_group_name("7") is None and parse_group_name("accelpact:x:gy") is None
    # two replicate groups of one generation never share store keys
    assert store_prefix("replicate", 1, [0, 2]) != store_prefix("replicate", 1, [1, 3])
    assert store_prefix("replicate", 1, [0, 2]) == "accelpact/replicate/g1/0.2/"


def test_timeouts_are_explicit_and_positive():
    assert as_timedelta(1.5) == datetime.timedelta(seconds=1.5)
    assert as_timedelta(datetime.timedelta(seconds=2)) == datetime.timedelta(seconds=2)
    for bad in (0, -1, datetime.timedelta(0)):
        with pytest.raises(ValueError):
            as_timedelta(bad)
    for bad in (None, "1s", True):
        with pytest.raises(TypeError):
            as_timedelta(bad)
    with pytest.raises(TypeError):
        make_group([0, 2], label="x")  # no default timeout, on purpose


def test_only_members_make_or_replace_and_membership_must_match():
    with pytest.raises(MembershipError, match="not a member"):
        make_group([1, 3], label="x", timeout=1)
    with pytest.raises(MembershipError, match="distinct"):
        make_group([0, 0], label="x", timeout=1)
    old = dist.new_group([0, 2])
    with pytest.raises(MembershipError, match="differs"):
        replace_group(old, ranks=[0, 1], label="x", generation=1, timeout=1)
    assert dist.get_process_group_ranks(old) == [0, 2]  # untouched


def test_retire_is_idempotent_and_recorded():
    group = dist.new_group([0, 2])
    assert retire_group(group) is True
    assert retire_group(group) is False
    assert group.group_name in retired_group_names()
    with pytest.raises(KeyError):
        dist.get_process_group_ranks(group)  # c10d no longer knows it


def test_an_unregistered_group_retired_by_abort_is_aborted_never_shut_down():
    """Found by review, by reading: a group c10d no longer knew was shut down whatever `abort`
    said; an NCCL shutdown finalizes (waits for every kernel), which a dead peer never lets end."""
    calls: list[str] = []

    class _Unregistered:
        group_name = "accelpact:test:unregistered"

        def abort(self):
            calls.append("abort")

        def shutdown(self):
            calls.append("shutdown")

        def __hash__(self):
            return id(self)

    pg, other = _Unregistered(), _Unregistered()
    other.group_name = "accelpact:test:unregistered2"
    assert retire_group(pg, abort=True) and calls == ["abort"]
    assert retire_group(other) and calls == ["abort", "shutdown"]  # gloo's route: a graceful close


class _PendingWork:
    """A gloo Work as `wait_unless` sees it: `wait(timeout)` raises "timed out" until the op is
    done (after `done_after` polls), then returns True or raises the op's own error."""

    def __init__(self, done_after: int | None, error: Exception | None = None, done_as_poll_ends: bool = False):
        self.polls, self.done_after, self.error = 0, done_after, error
        #: the op completes just after the poll that times out, before `is_completed` is asked
        self.done_as_poll_ends = done_as_poll_ends

    def is_completed(self) -> bool:
        return self.done_after is not None and self.polls > self.done_after

    def wait(self, timeout=None):
        self.polls += 1
        if not self.is_completed():
            if self.done_as_poll_ends:
                self.done_after = self.polls - 1
            raise RuntimeError("Operation timed out!")
        if self.error is not None:
            raise self.error
        return True


def test_a_gloo_wait_is_cut_short_only_when_its_world_is_abandoned():
    from accelpact.comm.backends import wait_unless
    from accelpact.errors import CollectiveAbandoned

    assert wait_unless(_PendingWork(done_after=3), lambda: False) is True  # finishes: no matter the polls
    asks = []
    with pytest.raises(CollectiveAbandoned, match="membership change"):
        wait_unless(_PendingWork(done_after=None), lambda: asks.append(1) or len(asks) >= 2)
    assert len(asks) == 2  # it asked at each poll that timed out, and gave up when told to
    with pytest.raises(RuntimeError, match="Connection closed by peer"):  # the op's own failure is its own
        wait_unless(_PendingWork(done_after=0, error=RuntimeError("Connection closed by peer")), lambda: True)


def test_an_op_that_completes_as_a_poll_times_out_is_not_reported_as_timed_out():
    """The race CI met: the poll's "Operation timed out!" was raised as the op's own error."""
    from accelpact.comm.backends import wait_unless

    assert wait_unless(_PendingWork(done_after=None, done_as_poll_ends=True), lambda: False) is True
    failed = _PendingWork(done_after=None, error=RuntimeError("Connection closed by peer"), done_as_poll_ends=True)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):  # its own error, not the poll's
        wait_unless(failed, lambda: False)


def test_a_retired_generation_is_never_built_again_until_a_rebuilt_world_forgets_it():
    """Found by review: only live groups were checked, so `replace_group(..., generation=0)` after
    g0 had been replaced was accepted: the same store prefix as the retired g0 (a rendezvous could
    read its keys), and an identity the classifier reads as retired."""
    from accelpact.comm.lifecycle import claim_identity, forget_retired, retire_group

    group = dist.new_group([0, 1])
    group._set_group_desc("accelpact:units-x:g0")  # as `replace_group` describes a generation it builds
    with pytest.raises(ValueError, match="is generation 'accelpact:units-x:g0' already"):
        claim_identity("units-x", 0)
    retire_group(group)
    with pytest.raises(ValueError, match="was retired in this process"):
        claim_identity("units-x", 0)
    assert claim_identity("units-x", 1) == "accelpact:units-x:g1"
    forget_retired(["accelpact:units-x:g0"])  # a world rebuilt on a fresh store prefix
    assert claim_identity("units-x", 0) == "accelpact:units-x:g0"
