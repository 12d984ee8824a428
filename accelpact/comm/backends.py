"""Which backend serves a group on which device, and how one is built.

A replacement must be built with the failed group's own backends: an NCCL data plane that came
back as gloo would crawl (DDP) or fail outright (FSDP2 reduces with ``ReduceOp.AVG``, which gloo
lacks). So the device->backend map is read from c10d's registry of the failed group
(``"cpu:gloo,cuda:gloo"``, ``"cuda:nccl"``, ``"cpu:gloo,cuda:nccl"``) and handed to the same
builders that made it. The boundary's probes and the validation all-reduce run on the device the
group's traffic uses (an NCCL group refuses CPU tensors).

Builders are looked up by backend name in `BUILDERS`, so that the NCCL route, which needs a GPU,
can be exercised on CPU with a stand-in (`register_builder`).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroup, Store
from torch.distributed import distributed_c10d as c10d

from . import _c10d

__all__ = [
    "BUILDERS",
    "CUT_SHORT_POLL",
    "wait_unless",
    "BuildRequest",
    "backend_spec",
    "DeviceBackends",
    "backends_of",
    "bounded_store",
    "wait_for",
    "parse_backends",
    "probe_device",
    "register_builder",
    "uses_nccl",
]

log = logging.getLogger("accelpact.comm")

#: device type -> backend name, e.g. {"cpu": "gloo", "cuda": "nccl"}
DeviceBackends = dict[str, str]


def parse_backends(spec: str) -> DeviceBackends:
    """``"gloo"`` -> {cpu: gloo, cuda: gloo}; ``"nccl"`` -> {cuda: nccl}; a ``"cpu:gloo,cuda:nccl"``
    string as written. c10d's own parser, so that names mean what they mean to c10d."""
    try:
        return dict(c10d.BackendConfig(c10d.Backend(spec)).get_device_backend_map())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"unknown process-group backend {spec!r}: {exc}") from exc


def backends_of(pg: ProcessGroup) -> DeviceBackends | None:
    """The device->backend map c10d registered for `pg`; None once c10d no longer knows it."""
    config = _c10d.backend_config(pg)
    return None if config is None else parse_backends(config)


def backend_spec(pg: ProcessGroup) -> str | None:
    """The backend string a group like `pg` is built from: a plain name ("gloo", "nccl") when one
    names exactly its map (what c10d and the wrappers compare against), else the device list."""
    backends = backends_of(pg)
    if backends is None:
        return None
    for name in dict.fromkeys(backends.values()):
        if parse_backends(name) == backends:
            return name
    return ",".join(f"{device}:{name}" for device, name in backends.items())


def uses_nccl(backends: DeviceBackends) -> bool:
    return "nccl" in backends.values()


def probe_device(backends: DeviceBackends, pg: ProcessGroup | None = None) -> torch.device:
    """Where a group's probes and validation run: on NCCL (it takes device tensors only; a mixed
    cpu:gloo,cuda:nccl group carries the model's traffic on NCCL, so that is the path to prove) the
    device `pg` is bound to (`init_process_group(device_id=...)`, which does not make it the current
    device, and a group bound to cuda:k refuses a tensor on another), else the current CUDA device;
    the CPU otherwise."""
    return cuda_device_of(pg) if uses_nccl(backends) else torch.device("cpu")


def cuda_device_of(pg: ProcessGroup | None) -> torch.device:
    """The CUDA device `pg` is bound to (`init_process_group(device_id=...)`), else the calling
    thread's current one."""
    bound = getattr(pg, "bound_device_id", None)
    return bound if bound is not None else torch.device("cuda", torch.cuda.current_device())


def wait_for(work, backends: DeviceBackends, bound: datetime.timedelta,
             cut_short: Callable[[], bool] | None = None):
    """Wait for a collective the way its backend needs. NCCL: with `bound` (a bare ``wait()`` only
    makes the stream wait, so a peer that never joins would never be noticed; with a bound the CPU
    waits, and on timeout c10d aborts the communicator and raises). Gloo: a bare wait, which the
    group's own timeout already bounds; a shorter CPU bound would abandon an op still queued on the
    gloo pair, and that op would pair with the group's next collective — except where the whole
    world is about to be destroyed, which `cut_short` says (`wait_unless`)."""
    if uses_nccl(backends):
        return work.wait(bound)
    return work.wait() if cut_short is None else wait_unless(work, cut_short)


#: How often a gloo wait that a membership change may cut short asks whether it should.
CUT_SHORT_POLL = datetime.timedelta(milliseconds=50)


def wait_unless(work, cut_short: Callable[[], bool]) -> bool:
    """A gloo wait that gives up, raising CollectiveAbandoned, once `cut_short()` says this world
    is being abandoned (a peer posted its presence for a membership change). Why: a rank whose own
    update went well meets the loss only in the boundary's collectives, with peers that already
    left for the membership change, and would otherwise wait out the group's timeout there before
    joining them (6 s of a 7.6 s detection in the shrink demo). Safe only because every group of
    the world is destroyed next: the abandoned op never pairs with a later collective. Its gloo
    thread would still wait for it until the group's timeout (and the group's destructor joins
    that thread), so the membership change closes the retired world's connections
    (`connections.sever`), which ends the op at once. A finished
    op (or a failed one, whose error is raised) returns at once; the group's timeout still bounds
    the wait.

    An op that completes between a poll's timeout and the look at `is_completed` is waited for
    again, never reported by the poll's "Operation timed out!": found by CI, where the last peer
    of a boundary check arrived just as a poll ended on a loaded machine, and this rank alone
    took a check that every peer passed for a failed one (it left for a membership change, its
    peers recovered without it, and the job was rejected)."""
    from ..errors import CollectiveAbandoned

    while True:
        try:
            return work.wait(CUT_SHORT_POLL)
        except RuntimeError:
            if work.is_completed():
                return work.wait()  # done now: its result, or the op's own error (never the poll's)
            if cut_short():
                raise CollectiveAbandoned("a peer left this world for a membership change: its collectives are "
                                          "abandoned") from None


def bounded_store(store: Store, timeout: datetime.timedelta) -> Store:
    """A connection to `store` whose waits give up after `timeout`.

    NCCL exchanges its unique id through a store ``get`` that waits for the store's own timeout
    (the default store's, often minutes), not the group's: a member that never arrives would keep
    a replacement's init blocked that long. A cloned client with its own timeout bounds it; a store
    that cannot be cloned is used as it is (and says so in the log)."""
    try:
        clone = store.clone()
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        log.info("store %s cannot be cloned (%s): group init is bounded by the store's own timeout",
                 type(store).__name__, exc)
        return store
    if clone is store:  # HashStore "clones" to itself: a timeout set here would be the job's
        return store
    clone.set_timeout(timeout)
    return clone


@dataclass(frozen=True)
class BuildRequest:
    """Everything a backend constructor needs for one member of one group."""

    store: PrefixStore  # the group's prefix; builders add their device's sub-prefix
    group_rank: int
    size: int
    timeout: datetime.timedelta
    members: list[int]
    name: str
    device: torch.device


Builder = Callable[[BuildRequest], tuple[object, ProcessGroup.BackendType]]


def _build_gloo(request: BuildRequest) -> tuple[object, ProcessGroup.BackendType]:
    from torch._C._distributed_c10d import ProcessGroupGloo

    gloo = ProcessGroupGloo(PrefixStore(f"{request.device.type}/", request.store), request.group_rank,
                            request.size, request.timeout)
    gloo.options.global_ranks_in_group = request.members
    gloo.options.group_name = request.name
    gloo._set_sequence_number_for_group()
    return gloo, ProcessGroup.BackendType.GLOO


def _build_nccl(request: BuildRequest) -> tuple[object, ProcessGroup.BackendType]:
    """Non-blocking, eagerly connected, bounded: as a replacement must be built (torchft does the
    same). Blocking init on a dead peer would outlast the control timeout; a lazy init at the first
    collective would wait for the store's timeout instead of the group's."""
    try:
        from torch._C._distributed_c10d import ProcessGroupNCCL
    except ImportError as exc:
        raise RuntimeError("this torch build has no NCCL (ProcessGroupNCCL): an NCCL group cannot be "
                           "built here") from exc
    options = ProcessGroupNCCL.Options()
    options.is_high_priority_stream = False
    options._timeout = request.timeout
    options.global_ranks_in_group = request.members
    options.group_name = request.name
    options.config.blocking = False
    store = PrefixStore(f"{request.device.type}/", bounded_store(request.store, request.timeout))
    nccl = ProcessGroupNCCL(store, request.group_rank, request.size, options)
    nccl._set_sequence_number_for_group()
    nccl.eager_connect_single_device(request.device)
    return nccl, ProcessGroup.BackendType.NCCL


BUILDERS: dict[str, Builder] = {"gloo": _build_gloo, "nccl": _build_nccl}


def register_builder(name: str, builder: Builder) -> Builder | None:
    """Install `builder` for backend `name`; returns the one it replaces (tests put it back)."""
    previous = BUILDERS.get(name)
    BUILDERS[name] = builder
    return previous


def build_backends(pg: ProcessGroup, backends: DeviceBackends, request: BuildRequest) -> None:
    """Register on `pg` one backend object per backend name (a gloo object serves every device
    mapped to gloo, as in c10d), and set the default backend as ``_new_process_group_helper`` does:
    NCCL when any device uses it."""
    unknown = sorted(set(backends.values()) - set(BUILDERS))
    if unknown:
        raise ValueError(f"backend(s) {unknown} are not supported for replacement (supported: {sorted(BUILDERS)})")
    default = "nccl" if uses_nccl(backends) else next(iter(backends.values()))
    pg._set_default_backend(c10d.Backend.backend_type_map[default])
    built: dict[str, tuple[object, ProcessGroup.BackendType]] = {}
    for device_type, name in backends.items():
        if name not in built:
            device = probe_device({device_type: name}, pg) if name == "nccl" else torch.device(device_type)
            built[name] = BUILDERS[name](_for_device(request, device))
        backend, backend_type = built[name]
        pg._register_backend(torch.device(device_type), backend_type, backend)


def _for_device(request: BuildRequest, device: torch.device) -> BuildRequest:
    return BuildRequest(request.store, request.group_rank, request.size, request.timeout, request.members,
                        request.name, device)
