"""The one place that touches c10d's private world registry (torch 2.13).

A replacement communicator must be indistinguishable, to c10d and DeviceMesh, from a group that
``dist.new_group`` made: resolvable by name (``_resolve_process_group``), known to
``dist.get_rank(group)`` / ``dist.get_process_group_ranks`` (``_world.pg_group_ranks``) and
destroyable by ``dist.destroy_process_group`` (which deletes from ``pg_map``, ``pg_names``,
``pg_group_ranks``, ``pg_backend_config``, ``pg_to_tag`` and unregisters the name). This module
fills exactly the tables ``_new_process_group_helper`` + ``_new_group_with_tag`` fill, so that
every later c10d call behaves as for its own groups. ``tests/test_comm_torch_pins.py`` fails
loudly when any of these internals move.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    ErrorType,
    PrefixStore,
    ProcessGroup,
    Store,
    _register_process_group,
    _resolve_process_group,
)
from torch.distributed import distributed_c10d as c10d

#: The torch release whose internals this module and the rebind rules were verified on.
VERIFIED_TORCH = "2.13"


def unverified_torch() -> str | None:
    """Why the installed torch is not the one the internals were verified on (None: it is)."""
    if torch.__version__.split("+")[0].rsplit(".", 1)[0] == VERIFIED_TORCH:
        return None
    return (f"torch {torch.__version__} is not the {VERIFIED_TORCH} release whose private c10d and framework "
            "internals AccelPact's group replacement and rebind rules were verified on "
            "(tests/test_comm_torch_pins.py): a recovery may fail or leave a stale reference")


__all__ = [
    "VERIFIED_TORCH",
    "unverified_torch",
    "abort_together",
    "around_group_construction",
    "backend_config",
    "default_group",
    "default_store",
    "device_error",
    "group_backends",
    "group_timeout",
    "group_count",
    "is_default_group",
    "is_registered",
    "name_is_taken",
    "register_group",
    "registered_groups",
    "registered_names",
    "registered_ranks",
    "resolve_name",
    "member_groups",
    "set_group_count",
    "set_group_timeout",
]


def default_store() -> Store:
    """The store of the default group (the root under which every group takes a prefix)."""
    return c10d._get_default_store()


def default_group() -> ProcessGroup:
    """The default (world) group; c10d raises when none is initialised."""
    return c10d._get_default_group()


def group_backends(pg: ProcessGroup) -> list:
    """The backend objects ``pg`` dispatches to, one per device type it serves."""
    backends = []
    for device_type in pg._device_types:
        try:
            backends.append(pg._get_backend(torch.device(device_type)))
        except RuntimeError:  # a device type listed without a backend object
            continue
    return backends


def is_registered(pg: ProcessGroup) -> bool:
    """Whether c10d still knows ``pg`` (False once destroyed)."""
    return pg in c10d._world.pg_map


def registered_ranks(pg: ProcessGroup) -> list[int] | None:
    """Global ranks of ``pg`` in group-rank order, or None when c10d no longer knows it."""
    mapping = c10d._world.pg_group_ranks.get(pg)
    if mapping is None:
        return None
    return sorted(mapping, key=mapping.__getitem__)


def resolve_name(name: str) -> ProcessGroup | None:
    """The group registered under ``name``, or None."""
    try:
        return _resolve_process_group(name)
    except (RuntimeError, ValueError, KeyError):
        return None


def registered_groups() -> list[ProcessGroup]:
    """Every group c10d knows in this process, the default group included."""
    return list(c10d._world.pg_names)


def registered_names() -> list[str]:
    """The c10d name of every group this process knows."""
    return [str(name) for name in c10d._world.pg_names.values()]


def name_is_taken(name: str) -> bool:
    return name in c10d._world.pg_names.values() or resolve_name(name) is not None


def register_group(
    pg: ProcessGroup, *, name: str, ranks: list[int], store: PrefixStore, backend: str
) -> None:
    """Enter ``pg`` into every c10d table, as ``_new_process_group_helper`` does for new groups."""
    world = c10d._world
    backend_config = str(c10d.BackendConfig(c10d.Backend(backend)))
    world.pg_map[pg] = (backend, store)
    world.pg_names[pg] = name
    world.pg_backend_config[pg] = backend_config
    world.pg_group_ranks[pg] = {global_rank: group_rank for group_rank, global_rank in enumerate(ranks)}
    tag = f"ptd:{name}"
    world.tags_to_pg.setdefault("", []).append(pg)
    world.tags_to_pg.setdefault(tag, []).append(pg)
    world.pg_to_tag[pg] = tag
    _register_process_group(name, pg)


def backend_devices(backend: str) -> list[torch.device]:
    """Devices a group of ``backend`` serves (gloo: cpu and cuda, as c10d registers it)."""
    device_map = c10d.BackendConfig(c10d.Backend(backend)).get_device_backend_map()
    return [torch.device(device) for device in device_map]


def destroy(pg: ProcessGroup) -> None:
    dist.destroy_process_group(pg)


def abort(pg: ProcessGroup) -> None:
    c10d._abort_process_group(pg)


def abort_together(pgs: list[ProcessGroup]) -> None:
    """Abort several groups inside one ``ncclGroupStart``/``ncclGroupEnd`` window, as c10d does
    for the world: aborting NCCL communicators one after the other while dependent work is in
    flight can deadlock (pytorch#119797). Groups without an NCCL backend are aborted plainly.

    Not verified on a GPU (none lent): upstream `ProcessGroupNCCL::abort()` runs its
    `abortComms()` on a `std::async` thread and waits for it, while NCCL's group window belongs to
    the calling thread, so the window may not cover the aborts at all (they would then run one
    after another, as c10d's own world abort does). The bound that holds either way is
    `comm.device`'s: an abort that hangs becomes a guard failure, never a hung recovery."""
    nccl = [backend for backend in (_nccl_backend(pg) for pg in pgs) if backend is not None]
    if nccl:
        nccl[0]._group_start()
    try:
        for pg in pgs:
            c10d._abort_process_group(pg)
    finally:
        if nccl:
            nccl[0]._group_end()


def _nccl_backend(pg: ProcessGroup):
    """`pg`'s NCCL backend object, or None (no cuda backend, or not NCCL)."""
    if "nccl" not in (backend_config(pg) or ""):
        return None
    try:
        backend = pg._get_backend(torch.device("cuda"))
    except RuntimeError:
        return None
    backend = getattr(backend, "wrapped_pg", backend)  # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps it
    return backend if hasattr(backend, "_group_start") else None


def device_error(pg: ProcessGroup) -> str | None:
    """The error `pg`'s NCCL backend recorded (its watchdog met a timed-out or failed collective:
    "TIMEOUT", "COMM_ERROR", "REMOTE_ERROR"), or None: no NCCL backend, or nothing recorded. Why:
    on NCCL a collective that failed inside an update raises nothing on the CPU; the watchdog
    aborts it, the stream goes on, and this is where the failure is left (`runtime.device_fence`)."""
    backend = _nccl_backend(pg)  # unwrapped where TORCH_DISTRIBUTED_DEBUG=DETAIL wraps it
    read = getattr(backend, "get_error", None)  # bound on ProcessGroupNCCL (CUDA builds; init.cpp)
    if read is None:
        return None
    error = read()
    return None if error == ErrorType.SUCCESS else str(error.name)


def backend_config(pg: ProcessGroup) -> str | None:
    """c10d's device->backend string of `pg` ("cpu:gloo,cuda:gloo", "cuda:nccl", ...), or None
    when c10d no longer knows the group."""
    config = c10d._world.pg_backend_config.get(pg)
    return None if config is None else str(config)


def is_default_group(pg: ProcessGroup) -> bool:
    """Whether `pg` is the default (world) group: destroying it tears down every group."""
    return dist.is_initialized() and pg is default_group()


def group_timeout(pg: ProcessGroup):
    """The timeout `pg`'s backends apply (a timedelta), or None when no backend reports one."""
    for device in pg._device_types:
        options = getattr(pg._get_backend(device), "options", None)
        timeout = getattr(options, "_timeout", None)
        if timeout is not None:
            return timeout
    return None


def set_group_timeout(pg: ProcessGroup, timeout) -> None:
    c10d._set_pg_timeout(timeout, pg)


def group_count() -> int:
    """c10d's counter of groups made by ``new_group`` in this world (it names them "1", "2", ...;
    every rank counts every call, members or not)."""
    return int(c10d._world.group_count)


def set_group_count(value: int) -> None:
    """Set the counter so that the next ``new_group`` takes the name ``str(value)``: a rebuilt
    world re-creates the job's groups under the names the job's script gives them, so a spare
    running that script meets the survivors on the same store keys."""
    c10d._world.group_count = int(value)


def member_groups() -> list[tuple[str, list[int], str]]:
    """(name, global ranks in group order, backend config) of every group this rank is a member
    of, the default group excluded, in c10d's registration order."""
    default = default_group() if dist.is_initialized() else None
    out = []
    for pg, name in c10d._world.pg_names.items():
        if pg is default:
            continue
        ranks = registered_ranks(pg)
        if ranks is not None:
            out.append((str(name), ranks, backend_config(pg) or ""))
    return out


def around_group_construction(wrap) -> None:
    """Route every group construction (``init_process_group``'s default group and each
    ``new_group`` / DeviceMesh group) through ``wrap(build, *args, **kwargs)``, once per process.
    c10d builds them all in ``_new_process_group_helper`` (looked up as a module global at each
    call), which returns ``(pg, store)``; the first wrap installed stays."""
    helper = c10d._new_process_group_helper
    if getattr(helper, "_accelpact_wrapped", False):
        return

    def built(*args, **kwargs):
        return wrap(helper, *args, **kwargs)

    built._accelpact_wrapped = True  # type: ignore[attr-defined]
    c10d._new_process_group_helper = built
