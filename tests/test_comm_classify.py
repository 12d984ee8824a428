"""classify_failure: constructed exceptions with the texts gloo, c10d, DeviceMesh and NCCL produce.

The texts below were captured from torch 2.13 gloo on this kind of machine; test_comm_lifecycle
classifies the live exceptions of a real world as well.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelpact.comm import FailureCause, classify_failure
from accelpact.comm.classify import exception_chain

GLOO_RECV_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                     "Timed out waiting 1000ms for recv operation to complete")
GLOO_SEND_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
                     "Timed out waiting 5000ms for send operation to complete")
GLOO_PAIR_CLOSED_BY_TIMEOUT = "Application timeout caused pair closure"
GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
               "peer [127.0.0.1]:26843. This is typically caused by a remote worker crashing. Check the logs "
               "of the remote worker before reporting an error. GLHF!")
GLOO_RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"
C10D_NOT_IN_WORLD = ("Process group <torch.distributed.distributed_c10d.ProcessGroup object at 0x7f6b5592d630> "
                     "is not initialized in the world group map. Please initialize the group first.")
MESH_UNRESOLVED = "Could not resolve the process group registered under the name accelpact:replicate:g0"
NCCL_WATCHDOG = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
                 "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600023 milliseconds before timing out.")


def _masked(outer: BaseException, inner: BaseException) -> BaseException:
    """What c10d does: its error path fails while handling the real error."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - c10d raises without "from": the real error stays in __context__
    except BaseException as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (GLOO_RECV_TIMEOUT, FailureCause.TIMEOUT),
        (GLOO_SEND_TIMEOUT, FailureCause.TIMEOUT),
        (GLOO_PAIR_CLOSED_BY_TIMEOUT, FailureCause.TIMEOUT),
        (NCCL_WATCHDOG, FailureCause.TIMEOUT),
        (GLOO_CLOSED, FailureCause.CONNECTION_CLOSED),
        (GLOO_RESET, FailureCause.CONNECTION_CLOSED),
        (C10D_NOT_IN_WORLD, FailureCause.RETIRED_COMMUNICATOR),
        (MESH_UNRESOLVED, FailureCause.RETIRED_COMMUNICATOR),
        ("expected a tensor of shape [4] but got [3]", FailureCause.OTHER),
    ],
)
def test_single_errors(text, cause):
    result = classify_failure(RuntimeError(text))
    assert result.cause is cause
    assert result.message == text
    assert result.chain == (f"RuntimeError: {text}",)


def test_c10d_mask_is_unwrapped_to_the_real_gloo_error():
    exc = _masked(ValueError(C10D_NOT_IN_WORLD), RuntimeError(GLOO_CLOSED))
    assert isinstance(exc.__context__, RuntimeError)
    result = classify_failure(exc)
    assert result.cause is FailureCause.RETIRED_COMMUNICATOR
    assert result.message == GLOO_CLOSED
    assert result.chain == (f"ValueError: {C10D_NOT_IN_WORLD}", f"RuntimeError: {GLOO_CLOSED}")


def test_explicit_cause_chain_is_followed_to_the_transport_error():
    outer = RuntimeError("backward failed in FSDP post-backward hook")
    outer.__cause__ = RuntimeError(GLOO_RECV_TIMEOUT)
    result = classify_failure(outer)
    assert result.cause is FailureCause.TIMEOUT
    assert result.message == GLOO_RECV_TIMEOUT
    assert len(result.chain) == 2


def test_innermost_transport_error_decides():
    outer = RuntimeError("Connection closed by peer while handling an earlier error")
    outer.__context__ = RuntimeError(GLOO_RECV_TIMEOUT)
    assert classify_failure(outer).cause is FailureCause.TIMEOUT


def test_python_exception_types_count_as_evidence():
    assert classify_failure(TimeoutError()).cause is FailureCause.TIMEOUT
    assert classify_failure(ConnectionResetError()).cause is FailureCause.CONNECTION_CLOSED
    assert classify_failure(BrokenPipeError("x")).cause is FailureCause.CONNECTION_CLOSED


def test_retired_group_named_in_a_message():
    exc = RuntimeError("allreduce on accelpact:replicate:g3 failed: " + GLOO_CLOSED)
    assert classify_failure(exc).cause is FailureCause.CONNECTION_CLOSED
    result = classify_failure(exc, retired_names=["accelpact:replicate:g3"])
    assert result.cause is FailureCause.RETIRED_COMMUNICATOR


def test_a_retired_name_is_not_read_into_a_live_group_whose_name_extends_it():
    """After ten recoveries generation 1 is retired and generation 12 live: a timeout on g12 is a
    timeout, not a use of the retired g1."""
    exc = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Timed out waiting 800ms for recv operation to "
                       "complete in group accelpact:dp@ab12:g12")
    assert classify_failure(exc, retired_names=["accelpact:dp@ab12:g1"]).cause is FailureCause.TIMEOUT
    named = RuntimeError("process group accelpact:dp@ab12:g1, was destroyed")
    assert classify_failure(named, retired_names=["accelpact:dp@ab12:g1"]).cause is \
        FailureCause.RETIRED_COMMUNICATOR


def test_groups_used_by_the_failed_step_attribute_a_bare_error():
    """DDP's C++ reducer raises the bare gloo text: only the caller knows which group it used."""
    exc = RuntimeError(GLOO_PAIR_CLOSED_BY_TIMEOUT)
    retired = ["accelpact:replicate:g0"]
    assert classify_failure(exc, retired_names=retired).cause is FailureCause.TIMEOUT
    used = ["accelpact:shard:g0", "accelpact:replicate:g0"]
    assert classify_failure(exc, retired_names=retired, used_group_names=used).cause is \
        FailureCause.RETIRED_COMMUNICATOR
    assert classify_failure(exc, used_group_names=used).cause is FailureCause.TIMEOUT  # nothing retired


class ProcessGroup:  # duck-typed stand-in: classify never imports torch
    def __init__(self, name: str, desc: str = "undefined") -> None:
        self.group_name = name
        self.group_desc = desc


def _collective(group: ProcessGroup) -> None:
    raise RuntimeError(GLOO_CLOSED)


def test_retired_group_held_by_a_traceback_frame():
    try:
        _collective(ProcessGroup("accelpact:replicate:g1"))
    except RuntimeError as exc:
        caught = exc
    assert classify_failure(caught).cause is FailureCause.CONNECTION_CLOSED
    assert classify_failure(caught, retired_names=["accelpact:replicate:g1"]).cause is \
        FailureCause.RETIRED_COMMUNICATOR
    assert classify_failure(caught, retired_names=["accelpact:replicate:g0"]).cause is \
        FailureCause.CONNECTION_CLOSED


def test_a_successor_under_its_predecessors_name_is_told_apart_by_its_identity():
    """A successor keeps the retired group's c10d name ("1"); its generation is its description.
    A frame holding the live successor is no evidence of a retired group, one holding the
    retired group itself is."""
    for held, retired in ((ProcessGroup("1", "accelpact:replicate:g1"), False), (ProcessGroup("1"), True)):
        try:
            _collective(held)
        except RuntimeError as exc:
            caught = exc
        cause = classify_failure(caught, retired_names=["1"]).cause
        assert cause is (FailureCause.RETIRED_COMMUNICATOR if retired else FailureCause.CONNECTION_CLOSED)


def test_a_text_naming_a_live_groups_name_is_no_evidence_of_the_retired_generation_of_that_name():
    """NCCL's log prefix is "PG GUID <name>(<description>)": about the live successor of a group
    `make_group` built, it names the retired first generation's identity as the kept name."""
    text = ("[PG ID 1 PG GUID accelpact:replicate:g0(accelpact:replicate:g1) Rank 0] ProcessGroupNCCL's "
            "watchdog got stuck for 480 seconds")
    retired = ["accelpact:replicate:g0"]
    assert classify_failure(RuntimeError(text), retired_names=retired).cause is FailureCause.RETIRED_COMMUNICATOR
    assert classify_failure(RuntimeError(text), retired_names=retired,
                            live_names=["accelpact:replicate:g0"]).cause is FailureCause.TIMEOUT
    named = "[PG ID 1 PG GUID accelpact:replicate:g0(accelpact:replicate:g0) Rank 0] watchdog got stuck"
    assert classify_failure(RuntimeError(named), retired_names=retired + ["x"],  # a retired identity that
                            live_names=["x"]).cause is FailureCause.RETIRED_COMMUNICATOR  # is no live name


def test_cyclic_chain_terminates():
    first, second = RuntimeError("first"), RuntimeError(GLOO_RESET)
    first.__context__, second.__context__ = second, first
    assert len(exception_chain(first)) == 2
    assert classify_failure(first).cause is FailureCause.CONNECTION_CLOSED


def test_empty_message_uses_repr():
    result = classify_failure(KeyError())
    assert result.cause is FailureCause.OTHER
    assert result.message == "KeyError()"


_KEYWORDS = ("time", "connection", "closed", "reset", "pipe", "socket", "world group map", "resolve",
             "destroy", "shut", "abort", "invalid process group", "remote", "refused", "nccl",
             "watchdog got stuck", "unhandled system error", "net/")


@given(st.lists(st.text(max_size=80), min_size=1, max_size=6))
def test_never_raises_and_unrelated_text_is_other(texts):
    head: BaseException | None = None
    for text in reversed(texts):
        exc = RuntimeError(text)
        exc.__context__ = head
        head = exc
    result = classify_failure(head)
    assert len(result.chain) == len(texts)
    if not any(keyword in text.lower() for text in texts for keyword in _KEYWORDS):
        assert result.cause is FailureCause.OTHER


# -- what is recovered: communication failures only; a bug in the step reaches the user -----------


def _dist_error(name: str, text: str) -> BaseException:
    import torch.distributed as dist

    return getattr(dist, name)(text)


def _raised_in(filename: str, exc: BaseException) -> BaseException:
    """`exc` as raised by code in `filename` (its innermost frame's file)."""
    code = compile("raise exc", f"/site-packages/{filename}", "exec")
    try:
        exec(code, {"exc": exc})
    except BaseException as raised:  # noqa: BLE001 - the test's own raise
        return raised
    raise AssertionError("not raised")


@pytest.mark.parametrize("make", [
    lambda: RuntimeError(GLOO_RECV_TIMEOUT),
    lambda: RuntimeError(GLOO_CLOSED),
    lambda: _masked(ValueError(C10D_NOT_IN_WORLD), RuntimeError(GLOO_CLOSED)),
    lambda: RuntimeError(NCCL_WATCHDOG),
    lambda: RuntimeError(MESH_UNRESOLVED),
    lambda: _raised_in("torch/distributed/rendezvous.py", ConnectionResetError()),
    lambda: _dist_error("DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1971, remote process exited"),
    lambda: _dist_error("DistNetworkError", "Failed to recv, got 0 bytes. Connection was likely closed."),
    # DDP's reducer re-raises gloo's error from its C++ bucket all-reduce
    lambda: RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:445] op.preamble.length "
                         "<= op.nbytes. 8 vs 4"),
], ids=["gloo-timeout", "gloo-closed", "c10d-mask", "nccl-watchdog", "mesh", "conn-reset", "dist-backend",
        "dist-network", "ddp-reducer-gloo"])
def test_communication_failures_are_recovered(make):
    from accelpact.comm import is_communication_failure

    assert is_communication_failure(make())


def test_an_injected_fault_declares_itself_a_communication_failure():
    from accelpact.comm import is_communication_failure
    from accelpact.faults import FaultPlan, InjectedFault

    assert is_communication_failure(InjectedFault(FaultPlan.parse("skip@2:forward:0").faults[0]))


@pytest.mark.parametrize("make", [
    lambda: ValueError("malformed batch"),
    lambda: KeyError("input_ids"),
    lambda: RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    lambda: RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 4x8)"),
    lambda: AssertionError("FSDP: expected the parameter to be sharded"),
    lambda: ZeroDivisionError("division by zero"),
    # found by review: any "timed out" or ConnectionError read as a communication failure, and the
    # step was rewound into the same failure until the budget ran out
    lambda: RuntimeError("DataLoader timed out after 30 seconds"),
    lambda: _raised_in("my_dataset/remote.py", ConnectionResetError(104, "Connection reset by peer")),
    lambda: ValueError("invalid timeout value for scheduler"),
], ids=["value", "key", "oom", "shapes", "fsdp-assert", "zero-div", "loader-timeout", "remote-data", "word"])
def test_a_bug_in_the_training_step_is_not_a_communication_failure(make):
    from accelpact.comm import is_communication_failure

    assert not is_communication_failure(make())


def test_a_retired_group_with_a_number_for_a_name_is_not_read_into_a_live_groups_error():
    """c10d names groups "1", "2", …: once "1" was retired, the "1" of "[10.0.0.1]:23456" in a live
    group's error read as it, and a peer loss became RETIRED_COMMUNICATOR (found by review)."""
    text = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:23456"
    got = classify_failure(RuntimeError(text), retired_names=["1", "4"])
    assert got.cause is FailureCause.CONNECTION_CLOSED
    named = classify_failure(RuntimeError("group accelpact:dp:g1 failed"), retired_names=["accelpact:dp:g1"])
    assert named.cause is FailureCause.RETIRED_COMMUNICATOR


def test_a_context_suppressed_by_raise_from_none_is_not_the_cause():
    """`wait_unless` hides its poll's "Operation timed out!" with `from None`; the chain followed it
    anyway and reported the abandoned wait as that timeout. It declares its own cause instead."""
    from accelpact.comm import is_communication_failure
    from accelpact.errors import CollectiveAbandoned

    def abandon():
        try:
            raise RuntimeError("Operation timed out!")
        except RuntimeError:
            raise CollectiveAbandoned("a peer left this world") from None

    with pytest.raises(CollectiveAbandoned) as got:
        abandon()
    assert len(exception_chain(got.value)) == 1
    assert classify_failure(got.value).message == "a peer left this world"
    assert is_communication_failure(got.value)
