"""The GPU path, checked on CPU: what can be decided without a GPU is tested here; what needs one
is `scripts/gpu_check.sh` (see README, "The GPU path").

* a replacement keeps the failed group's backends (gloo -> gloo for real; nccl -> nccl through a
  stand-in NCCL builder), and NCCL groups that failed together are aborted together, before any
  replacement is built;
* probes and validation run on the device the group's traffic uses, with a bounded wait;
* the guard aborts before it synchronises, bounds both, and escalates to the other groups when the
  device stays busy;
* the NCCL environment is set by `accelpact.init_process_group` and refused at `attach` when unfit;
* recorded NCCL error texts are classified.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch

from accelpact.comm import FailureCause, classify_failure, is_communication_failure, nccl_env
from accelpact.comm import backends as backends_module
from accelpact.comm.backends import parse_backends, probe_device
from accelpact.comm.device import settle_device
from accelpact.errors import ConfigError
from accelpact.fsm.decisions import GroupId
from accelpact.fsm.effects import Quiesce

# ------------------------------------------------------------------ backends kept by replace ---


@pytest.fixture(scope="module")
def backends() -> list[dict]:
    from accelpact.testing.gpu_path import backends_world
    from accelpact.testing.spawn import run_world

    return run_world(backends_world, 2, timeout_s=120, pg_timeout_s=20)


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_a_gloo_group_is_replaced_by_a_gloo_group(backends):
    for rank, out in enumerate(backends):
        assert out["gloo_spec"] == "gloo", rank
        assert out["gloo_config"] == "cpu:gloo,cuda:gloo"
        assert out["gloo_validated"] == 1  # 0 + 1


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_an_nccl_group_is_replaced_by_an_nccl_group_built_non_blocking_on_the_device(backends):
    for out in backends:
        assert out["replace_ok"], out["replace_reason"]
        assert set(out["nccl_spec_before"].values()) == {"nccl"}
        assert out["nccl_spec_after"] == {"bp-replicate": "nccl", "bp-shard": "nccl"}
        assert set(out["nccl_config_after"].values()) == {"cuda:nccl"}
        builds = [e for e in out["events"][:out["events"].index(("standby",))] if e[0] == "build"]
        # built under the retired groups' names (the generation's identity is the description)
        assert [name for _, name, _, _ in builds[-2:]] == ["accelpact:bp-replicate:g0", "accelpact:bp-shard:g0"]
        assert all(device == "cuda:0" and timeout == 7.0 for _, _, device, timeout in builds[-2:])
        assert not any(out["old_registered"].values())


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_failed_nccl_groups_are_aborted_together_before_any_replacement_is_built(backends):
    for out in backends:
        after = out["events"][out["events"].index(("built",)) + 1:out["events"].index(("standby",))]
        assert after[0] == ("abort", ["accelpact:bp-replicate:g0", "accelpact:bp-shard:g0"])
        assert [e[0] for e in after[1:]] == ["build", "build"]


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_nccl_standbys_are_built_ahead_through_the_nccl_builder_and_adopted_after_the_abort(backends):
    for out in backends:
        events = out["events"]
        ahead = events[events.index(("standby",)) + 1:events.index(("filled",))]
        assert [(e[0], e[1]) for e in ahead] == [("build", "accelpact:bp-replicate:s1"), ("build", "accelpact:bp-shard:s1")]
        assert all(device == "cuda:0" and timeout == 7.0 for _, _, device, timeout in ahead)
        after = events[events.index(("filled",)) + 1:]
        assert after == [("abort", ["accelpact:bp-replicate:g1", "accelpact:bp-shard:g1"])]  # and nothing built
        assert out["adopt_ok"], out["adopt_reason"]
        assert out["adopted"] == {"bp-replicate": ("accelpact:bp-replicate:g0", "accelpact:bp-replicate:g2", "nccl", [0, 1]),
                                  "bp-shard": ("accelpact:bp-shard:g0", "accelpact:bp-shard:g2", "nccl", [0, 1])}


def test_backend_strings_parse_as_c10d_parses_them():
    assert parse_backends("gloo") == {"cpu": "gloo", "cuda": "gloo"}
    assert parse_backends("nccl") == {"cuda": "nccl"}
    assert parse_backends("cpu:gloo,cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}
    with pytest.raises(ValueError, match="unknown process-group backend"):
        parse_backends("cpu:gloo,cuda")


def test_an_unsupported_backend_is_refused_by_name():
    from torch._C._distributed_c10d import ProcessGroup

    request = backends_module.BuildRequest(None, 0, 1, datetime.timedelta(seconds=1), [0], "x", torch.device("cpu"))
    with pytest.raises(ValueError, match=r"\['ucc'\].*not supported"):
        backends_module.build_backends(ProcessGroup.__new__(ProcessGroup), {"cpu": "ucc"}, request)


def test_a_bound_group_s_successor_connects_its_nccl_communicator_on_the_bound_device(monkeypatch):
    """`lifecycle._build` binds the group before its backends are built, so the NCCL builder's
    eager connect uses the bound device, not the current one (cuda:0 on every rank of a node when
    the script bound by `device_id=` without `set_device`)."""
    from torch._C._distributed_c10d import HashStore, PrefixStore

    from accelpact.comm import lifecycle

    seen = []

    def builder(request):
        seen.append(request.device)
        raise RuntimeError("stand-in: no NCCL on this machine")

    previous = backends_module.register_builder("nccl", builder)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    try:
        for device in (torch.device("cuda", 1), None):
            with pytest.raises(RuntimeError, match="stand-in"):
                lifecycle._build([0], 0, "n", "i", PrefixStore("p/", HashStore()), datetime.timedelta(seconds=1),
                                 "nccl", device)
        with pytest.raises(ValueError, match="one indexed device"):
            lifecycle.connect([0], name="n", identity="i", prefix="q/", timeout=1, store=HashStore(), backend="nccl",
                              device=torch.device("cuda"))
    finally:
        backends_module.register_builder("nccl", previous)
    assert seen == [torch.device("cuda", 1), torch.device("cuda", 3)]


# ------------------------------------------------------------------ probes on the device ---


def test_probes_run_on_the_cpu_for_gloo_and_on_the_current_gpu_for_nccl(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert probe_device(parse_backends("gloo")) == torch.device("cpu")
    assert probe_device(parse_backends("nccl")) == torch.device("cuda", 3)
    assert probe_device(parse_backends("cpu:gloo,cuda:nccl")) == torch.device("cuda", 3)
    # a group bound to its device (init_process_group(device_id=...)) is probed there, whatever the
    # current device is (found by review: a group bound to cuda:1 refuses a tensor on cuda:0)
    from types import SimpleNamespace

    bound = SimpleNamespace(bound_device_id=torch.device("cuda", 1))
    assert probe_device(parse_backends("nccl"), bound) == torch.device("cuda", 1)
    assert probe_device(parse_backends("nccl"), SimpleNamespace(bound_device_id=None)) == torch.device("cuda", 3)
    assert probe_device(parse_backends("gloo"), bound) == torch.device("cpu")


class _Work:
    def __init__(self, log: list):
        self.log = log

    def wait(self, timeout=None):
        self.log.append(timeout)
        return True


def _bare_plane(specs: dict[str, str], timeout_s: float):
    from accelpact.runtime.data_plane import DataPlane

    plane = object.__new__(DataPlane)
    plane.groups = {label: object() for label in specs}
    plane.gids = {label: GroupId(label, (0, 1)) for label in specs}
    plane.backend_specs = dict(specs)
    plane.timeout_s = timeout_s
    plane._probes = {}
    plane.cut_short = None  # no membership change watched
    return plane


def test_an_nccl_probe_is_waited_for_with_a_bound_below_the_group_timeout_and_gloo_by_its_own(monkeypatch):
    import accelpact.runtime.data_plane as data_plane

    waits: list = []
    devices: list = []

    def all_reduce(tensor, group=None, async_op=False):
        devices.append(tensor.device)
        return _Work(waits)

    monkeypatch.setattr(data_plane.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(data_plane, "probe_device", lambda backends, pg=None: torch.device("cpu"))  # no GPU here
    plane = _bare_plane({"replicate": "nccl", "shard": "gloo"}, timeout_s=10.0)
    assert plane.health_check() == ([], [])
    # NCCL: a bare wait() only orders the stream and never raises; gloo: its group timeout bounds a
    # bare wait, and a shorter CPU bound would leave the op queued to pair with the next collective
    assert waits == [datetime.timedelta(seconds=9.0), None]
    assert len(devices) == 2


def test_validation_waits_with_the_bound_it_is_given_on_nccl(monkeypatch):
    import accelpact.comm.validate as validate

    waits: list = []

    class Group:
        group_name = "g"

        def size(self):
            return 2

    def all_reduce(tensor, group=None, async_op=False):
        tensor.fill_(1)
        return _Work(waits)

    monkeypatch.setattr(validate.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(validate.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(validate, "backends_of", lambda pg: {"cuda": "nccl"})
    monkeypatch.setattr(validate, "probe_device", lambda backends, pg=None: torch.device("cpu"))
    result = validate.validate_group(Group(), [0, 1], timeout=datetime.timedelta(seconds=4))
    assert result.observed_sum == 1 and waits == [datetime.timedelta(seconds=4)]


# ------------------------------------------------------------------ abort before sync ---


class _Device:
    """A device with a kernel stuck on `stuck_on` until that group is aborted."""

    def __init__(self, stuck_on: set[str], abort_hangs: bool = False):
        self.stuck_on = set(stuck_on)
        self.abort_hangs = abort_hangs
        self.log: list[str] = []
        self._free = threading.Event()
        if not self.stuck_on:
            self._free.set()

    def synchronize(self) -> None:
        self.log.append("sync-start")
        self._free.wait()
        self.log.append("sync-done")

    def abort(self, groups: list) -> None:
        self.log.append("abort " + ",".join(sorted(groups)))
        if self.abort_hangs:
            threading.Event().wait()
        self.stuck_on -= set(groups)
        if not self.stuck_on:
            self._free.set()


def _groups(*labels: str) -> dict[str, str]:
    return {label: label for label in labels}  # the fake abort receives the "groups" it is given


def test_known_broken_groups_are_aborted_before_anything_synchronises():
    device = _Device(stuck_on={"replicate"})
    settled = settle_device(broken=_groups("replicate"), others=_groups("shard"), timeout_s=2.0,
                            synchronize=device.synchronize, abort=device.abort)
    assert settled.drained and settled.aborted == ("replicate",) and not settled.escalated
    assert device.log == ["abort replicate", "sync-start", "sync-done"]


def test_a_device_stuck_on_a_group_not_known_broken_escalates_to_the_other_groups():
    device = _Device(stuck_on={"shard"})
    t = time.perf_counter()
    settled = settle_device(broken=_groups("replicate"), others=_groups("shard"), timeout_s=0.3,
                            synchronize=device.synchronize, abort=device.abort)
    assert settled.drained and settled.escalated == ("shard",)
    assert device.log == ["abort replicate", "sync-start", "abort shard", "sync-done"]
    assert time.perf_counter() - t < 5


def test_an_abort_that_hangs_is_bounded_and_named():
    device = _Device(stuck_on={"replicate"}, abort_hangs=True)
    settled = settle_device(broken=_groups("replicate"), others={}, timeout_s=0.2,
                            synchronize=device.synchronize, abort=device.abort)
    assert not settled.drained and "did not return within 0.2 s" in settled.reason and "2.26.2" in settled.reason
    assert "sync-start" not in device.log  # never synchronised behind the stuck kernel


def test_a_device_that_never_drains_fails_the_guard_instead_of_hanging_it():
    device = _Device(stuck_on={"elsewhere"})
    settled = settle_device(broken={}, others=_groups("shard"), timeout_s=0.2,
                            synchronize=device.synchronize, abort=device.abort)
    assert not settled.drained and "still running" in settled.reason


def _guard_plane(specs: dict[str, str]):
    plane = _bare_plane(specs, timeout_s=0.3)
    plane.groups = {label: label for label in specs}
    return plane


def _patch_retire(monkeypatch, device: _Device) -> None:
    import accelpact.runtime.guard as guard

    monkeypatch.setattr(guard, "retire_groups", lambda groups, abort: device.abort(list(groups)))


def test_the_guard_aborts_every_nccl_group_of_an_interrupted_update_first(monkeypatch):
    import accelpact.runtime.guard as guard

    device = _Device(stuck_on={"shard"})
    _patch_retire(monkeypatch, device)
    plane = _guard_plane({"replicate": "nccl", "shard": "nccl", "host": "gloo"})
    assert guard.settle(plane, Quiesce(discard=True), synchronize=device.synchronize) is None
    assert device.log == ["abort replicate,shard", "sync-start", "sync-done"]


def test_at_a_committed_boundary_only_the_failed_groups_are_aborted(monkeypatch):
    import accelpact.runtime.guard as guard

    device = _Device(stuck_on={"replicate"})
    _patch_retire(monkeypatch, device)
    plane = _guard_plane({"replicate": "nccl", "shard": "nccl"})
    failed = (GroupId("replicate", (0, 1)),)
    assert guard.settle(plane, Quiesce(discard=False, failed=failed), synchronize=device.synchronize) is None
    assert device.log == ["abort replicate", "sync-start", "sync-done"]


def test_a_committed_boundary_that_needed_an_unfailed_group_aborted_is_not_preserved(monkeypatch):
    import accelpact.runtime.guard as guard

    device = _Device(stuck_on={"shard"})
    _patch_retire(monkeypatch, device)
    plane = _guard_plane({"replicate": "nccl", "shard": "nccl"})
    verdict = guard.settle(plane, Quiesce(discard=False, failed=(GroupId("replicate", (0, 1)),)),
                           synchronize=device.synchronize)
    assert verdict is not None and not verdict.ok and "['shard']" in verdict.reason


def test_the_driver_hands_the_failed_groups_to_the_guard():
    from accelpact.fsm.driver import Observation, run_recovery
    from accelpact.fsm.machine import RecoveryContext, RecoveryMachine
    from accelpact.fsm.phases import FailurePhase
    from accelpact.fsm.simulation import SimExecutor  # noqa: F401 - the protocol both executors follow

    failed = (GroupId("replicate", (0, 1)),)
    obs = Observation(rank=0, world_size=2, frontier=3, generation=0, opt_step=3,
                      failure_phase=FailurePhase.COMMITTED, saw_failure=True, failed_groups=failed, cause="x")
    machine = RecoveryMachine(RecoveryContext(0))
    machine.fire("commit_update")
    gen = run_recovery(machine, obs)
    first = next(gen)
    assert isinstance(first, Quiesce) and first.failed == failed and not first.discard


# ------------------------------------------------------------------ NCCL environment ---

FIT = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_ENABLE_MONITORING": "0",
       "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0", "TORCH_NCCL_NONBLOCKING_TIMEOUT": "60"}


def test_a_fit_environment_and_nccl_version_pass():
    assert nccl_env.problems(FIT, (2, 26, 2)) == []
    assert nccl_env.problems(FIT, None) == []  # no NCCL in this build: nothing to say about it


def test_every_unfit_variable_and_an_old_nccl_are_named_with_the_required_value():
    found = nccl_env.problems({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_BLOCKING_WAIT": "1"}, (2, 25, 1))
    text = "\n".join(found)
    assert len(found) == 7
    assert "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC is unset" in text
    assert "NCCL_BLOCKING_WAIT is '1', must be unset or off ('0')" in text
    for off in ("0", "false", "No", "f"):  # as c10d's boolean parser reads them
        assert nccl_env.problems({**FIT, "TORCH_NCCL_BLOCKING_WAIT": off}, (2, 26, 2)) == []
    assert nccl_env.problems({**FIT, "TORCH_NCCL_BLOCKING_WAIT": ""}, (2, 26, 2))  # c10d throws on it
    blocking = {**FIT, "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert any("'1' -> '0'" in c for c in nccl_env.apply_required(blocking)) and blocking["TORCH_NCCL_BLOCKING_WAIT"] == "0"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING is '1', must be '2'" in text
    assert "TORCH_NCCL_NONBLOCKING_TIMEOUT is unset (c10d's default applies: 30 minutes)" in text
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT is unset" in text and "must be '0'" in text
    assert "TORCH_NCCL_ENABLE_MONITORING is unset" in text
    assert "NCCL 2.25.1 is older than 2.26.2" in text
    with pytest.raises(ConfigError, match="TORCH_NCCL_ENABLE_MONITORING"):
        nccl_env.refuse_unfit({}, None)


def test_init_process_group_sets_the_nccl_environment_before_init_and_leaves_gloo_alone(monkeypatch):
    from torch.distributed import distributed_c10d as c10d

    import accelpact.launch as launch

    # init_process_group wraps c10d's group helper for the whole process (connections.track):
    # restored afterwards, so that tests after this one see c10d's own (test_comm_torch_pins)
    monkeypatch.setattr(c10d, "_new_process_group_helper", c10d._new_process_group_helper)
    seen: list[dict] = []
    monkeypatch.setattr(launch.dist, "init_process_group", lambda *a, **k: seen.append(
        {var: launch.os.environ.get(var) for var in FIT}))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    for var in FIT:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # what torchrun sets
    launch.init_process_group("gloo")
    assert seen[-1]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and seen[-1]["TORCH_NCCL_ENABLE_MONITORING"] is None
    launch.init_process_group("cpu:gloo,cuda:nccl")
    assert seen[-1] == FIT  # in place when the communicators read them
    # a gloo default group on a CUDA host: its data plane may be new_group(backend="nccl")
    for var in FIT:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(launch, "_cuda_available", lambda: True)
    launch.init_process_group("gloo")
    assert seen[-1] == FIT


def test_attach_refuses_an_nccl_data_plane_in_an_unfit_environment(monkeypatch):
    import importlib

    import accelpact

    attach_module = importlib.import_module("accelpact.runtime.attach")  # the package exports the function

    class NcclPlane:
        def __init__(self, *args, **kwargs):
            pass

        def refuse_default_group(self):
            pass

        def uses_nccl(self):
            return True

    monkeypatch.setattr(attach_module, "DataPlane", NcclPlane)
    monkeypatch.setattr(attach_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(attach_module.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(attach_module.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(attach_module, "_build", lambda *a, **k: pytest.fail("attach went on in an unfit environment"))
    for var, value in FIT.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="TORCH_NCCL_ASYNC_ERROR_HANDLING is '3', must be '2'"):
        accelpact.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), config=accelpact.Config(profile="ddp"))


# ------------------------------------------------------------------ NCCL error texts ---

RECORDED = [
    ("NCCL communicator was aborted on rank 1. Original reason for failure was: [Rank 1] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=10000) ran for 10012 milliseconds before timing out.", FailureCause.TIMEOUT),
    ("NCCL communicator was aborted on rank 3.", FailureCause.CONNECTION_CLOSED),
    ("NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, remote process exited or there was a "
     "network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error or a "
     "remote process exiting prematurely.", FailureCause.CONNECTION_CLOSED),
    ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run "
     "with NCCL_DEBUG=INFO for details), NCCL version 2.26.2", FailureCause.CONNECTION_CLOSED),
    ("[PG ID 1 PG GUID 1(accelpact:replicate:g1) Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 seconds "
     "without making progress in monitoring enqueued collectives.", FailureCause.TIMEOUT),
    ("Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent "
     "GPU operations might run on corrupted/incomplete data.", FailureCause.TIMEOUT),
    ("NET/IB : Got completion from peer 10.0.0.2<44921> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=0 len=0 "
     "vendor err 129 (Recv)", FailureCause.CONNECTION_CLOSED),
    ("NET/Socket : peer 10.0.0.2<51234> message truncated", FailureCause.CONNECTION_CLOSED),
]


@pytest.mark.parametrize(("text", "cause"), RECORDED, ids=[f"nccl-{i}" for i in range(len(RECORDED))])
def test_recorded_nccl_errors_are_classified_as_communication_failures(text, cause):
    error = RuntimeError(text)
    assert classify_failure(error).cause is cause
    assert is_communication_failure(error)


def test_an_nccl_communicator_this_process_retired_is_a_stale_reference():
    error = RuntimeError("NCCL communicator was aborted on rank 0.")
    got = classify_failure(error, retired_names=["accelpact:replicate:g0"], used_group_names=["accelpact:replicate:g0"])
    assert got.cause is FailureCause.RETIRED_COMMUNICATOR


# ------------------------------------------------------------------ two runtimes, one process ---


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_a_second_runtime_in_the_same_process_recovers_under_names_of_its_own():
    from accelpact.testing.reattach import reattach_world
    from accelpact.testing.spawn import run_world

    for out in run_world(reattach_world, 2, timeout_s=150, pg_timeout_s=20):
        assert out["actions"] == ["preserve", "preserve"]
        first, second = out["names"]
        assert first != second and first.endswith(":g1") and second.endswith(":g1")


def test_the_platform_is_cuda_nccl_when_nccl_carries_every_group_on_the_gpu(monkeypatch):
    import importlib

    detect = importlib.import_module("accelpact.runtime.detect")
    maps = {"a": {"cpu": "gloo", "cuda": "gloo"}, "b": {"cuda": "nccl"}, "c": {"cpu": "gloo", "cuda": "nccl"}}
    monkeypatch.setattr(detect, "backends_of", lambda pg: maps[pg])
    assert detect.detect_platform({"x": "a"}) == "cpu-gloo"
    assert detect.detect_platform({"x": "b", "y": "c"}) == "cuda-nccl"  # a DCP-style default backend counts
    assert detect.detect_platform({"x": "a", "y": "b"}) == "cpu:gloo,cuda:gloo+cuda:nccl"


# ------------------------------------------------------------------ the NCCL builder's contract ---


class _FakeNCCL:
    """Stands in for ProcessGroupNCCL (absent from this CPU build): records how it is built."""

    built: list = []

    class Options:
        def __init__(self):
            self.config = type("Config", (), {"blocking": True})()

    def __init__(self, store, rank, size, options):
        self.store, self.rank, self.size, self.options = store, rank, size, options
        self.calls: list = []
        _FakeNCCL.built.append(self)

    def _set_sequence_number_for_group(self):
        self.calls.append("sequence")

    def eager_connect_single_device(self, device):
        self.calls.append(("eager", str(device)))


def test_an_nccl_replacement_is_non_blocking_eager_and_waits_on_the_store_no_longer_than_its_timeout(monkeypatch):
    import torch._C._distributed_c10d as c10d_ext
    import torch.distributed as dist

    monkeypatch.setattr(c10d_ext, "ProcessGroupNCCL", _FakeNCCL, raising=False)
    root = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=300))
    request = backends_module.BuildRequest(dist.PrefixStore("accelpact/x/g1/0.1/", root), 1, 2,
                                           datetime.timedelta(seconds=1), [0, 1], "accelpact:x:g1",
                                           torch.device("cuda", 2))
    _FakeNCCL.built.clear()
    backend, kind = backends_module.BUILDERS["nccl"](request)
    assert kind is backends_module.ProcessGroup.BackendType.NCCL and backend is _FakeNCCL.built[0]
    options = backend.options
    assert options.config.blocking is False and options._timeout == datetime.timedelta(seconds=1)
    assert options.global_ranks_in_group == [0, 1] and options.group_name == "accelpact:x:g1"
    assert not options.is_high_priority_stream
    assert backend.calls == ["sequence", ("eager", "cuda:2")]  # connected now, not at the first collective
    t = time.perf_counter()
    with pytest.raises(dist.DistStoreError):
        backend.store.get("never-set")  # NCCL's unique-id exchange waits like this
    assert time.perf_counter() - t < 30  # the group's timeout (1 s), not the root store's 300 s
    assert root.timeout == datetime.timedelta(seconds=300)  # the job's store keeps its own timeout


def test_a_store_that_cannot_be_cloned_is_used_as_it_is():
    import torch.distributed as dist

    class Uncloneable(dist.Store):
        pass

    store = Uncloneable()
    assert backends_module.bounded_store(store, datetime.timedelta(seconds=1)) is store
    hashed = dist.HashStore()  # its clone() returns itself: bounding that would bound the job's store
    hashed.set_timeout(datetime.timedelta(seconds=30))
    assert backends_module.bounded_store(hashed, datetime.timedelta(seconds=1)) is hashed
    assert hashed.timeout == datetime.timedelta(seconds=30)


def test_a_replacement_communicators_setup_is_bounded_and_a_version_suffix_is_read():
    """Found by review, by reading: c10d waits 30 minutes (its default) for a non-blocking
    communicator to become ready, inside the first collective posted on it; and NCCL builds with a
    version suffix return it as a fourth, string element, which failed attach with a ValueError."""
    env: dict[str, str] = {"TORCH_NCCL_NONBLOCKING_TIMEOUT": "1800"}
    changes = nccl_env.apply_required(env)
    assert env["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "60" and any("'1800' -> '60'" in c for c in changes)
    assert nccl_env.problems(env, (2, 26, 2)) == []
    assert any("must be whole seconds" in p for p in nccl_env.problems({**env, "TORCH_NCCL_NONBLOCKING_TIMEOUT": "x"},
                                                                        None))

    class _Nccl:
        @staticmethod
        def version():
            return (2, 26, 2, "+cuda12.4")

    import torch

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "nccl", _Nccl, raising=False)
        assert nccl_env.nccl_version() == (2, 26, 2)


def test_the_drain_synchronizes_this_ranks_device_from_its_helper_thread(monkeypatch):
    """The bounded drain runs `torch.cuda.synchronize` on a helper thread, whose current device is 0:
    it must name the device the rank was on (found by review: LOCAL_RANK 3 drained GPU 0 instead)."""
    import threading
    from types import SimpleNamespace

    import torch

    import accelpact.runtime.guard as guard

    synced = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(
        (device, threading.current_thread() is threading.main_thread())))
    plane = _guard_plane({"host": "gloo"})
    assert guard.settle(plane, Quiesce(discard=True)) is None
    assert synced == [(torch.device("cuda", 3), False)]  # device 3, on the helper thread
    synced.clear()  # an NCCL group bound to cuda:1 (not the current device): that one is drained
    plane = _guard_plane({"shard": "nccl"})
    plane.groups = {"shard": SimpleNamespace(bound_device_id=torch.device("cuda", 1))}
    monkeypatch.setattr(guard, "retire_groups", lambda groups, abort: None)
    assert guard.settle(plane, Quiesce(discard=True)) is None
    assert synced == [(torch.device("cuda", 1), False)]
