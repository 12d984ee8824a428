"""Communicator lifecycle: make a group, retire it, replace it with one of identical membership.

A replacement is built only by the members of the failed group, directly from a backend on a
fresh store prefix, under a deterministic name; nothing here needs the other world ranks, so a
recovery never stalls ranks that are not involved (``dist.new_group`` would: without local
synchronisation it must be called by every world rank, and with it names and prefixes can collide
with the destroyed group's).

Names, identities and prefixes (generation ``g``, label ``L``, members ``r0 < r1 < …``;
`comm.naming` says why a replacement keeps its predecessor's name):

* registered name: a replacement keeps the retired group's (c10d's "1", or ``accelpact:L:g0``
  for a group `make_group` built), so c10d, DeviceMesh and compiled regions find the successor
  under the name they hold; one live group per name in a process;
* identity ``accelpact:L:g<g>`` (the group's description) — unique per process among live
  groups; the retired-group ledger records identities;
* store prefix ``accelpact/L/g<g>/r0.r1…/`` — unique across the world, because two groups with
  the same label and generation (e.g. replicate groups {0,2} and {1,3}) must never share keys.

NCCL (device groups; not runnable on this CPU machine, kept correct by reading c10d):

* backend ``"nccl"`` builds ``ProcessGroupNCCL(store, rank, size, options)`` with
  ``options._timeout``, ``options.global_ranks_in_group``, ``options.group_name`` and
  ``is_high_priority_stream = False``, registered for ``cuda``; a mixed ``"cpu:gloo,cuda:nccl"``
  group registers one backend per device;
* a failed NCCL communicator must be **aborted** (``ncclCommAbort``: returns even when peers are
  dead or a kernel is stuck), never destroyed (``ncclCommDestroy`` may block on the dead peer):
  ``retire_group(pg, abort=True)``. Gloo has no such distinction (``shutdown`` closes sockets);
* set ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` or the watchdog tears the process down before the
  recovery runs, and use ``device_id`` binding only if every member binds the same way;
* a group bound to a device (``init_process_group(device_id=...)``: ``new_group`` binds every
  subgroup the same way) keeps the binding through a replacement: the successor is bound to the
  retired group's device *before* its backends are registered (c10d hands the binding to each
  backend as it is registered), as ``_new_process_group_helper`` and ``shrink_group`` do. Bound
  NCCL groups do not make their device current, so without it a successor's probes and barrier
  would guess the current device, cuda:0 on every rank of a node, and fail the recovery.
"""

from __future__ import annotations

import datetime
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroup, Store

from accelpact.comm import _c10d, connections
from accelpact.comm.backends import BuildRequest, backend_spec, build_backends, parse_backends, uses_nccl
from accelpact.comm.naming import group_identity, group_name, parse_group_name, store_prefix
from accelpact.errors import AccelPactError

if TYPE_CHECKING:
    from accelpact.comm.standby import Standby

__all__ = [
    "MembershipError",
    "group_identity",
    "group_name",
    "make_group",
    "parse_group_name",
    "replace_group",
    "retire_group",
    "retire_groups",
    "retired_group_names",
    "store_prefix",
]


class MembershipError(AccelPactError, ValueError):
    """The caller is not a member, or a replacement would not have identical membership."""


_ledger_lock = threading.Lock()
_retired_names: list[str] = []  # identities (`naming.group_identity`): the classifier's evidence
#: Retired groups still referenced somewhere. Weak: once nothing holds a retired group it is
#: freed (its sockets, pipes and threads with it) and drops out of here, so a long job's
#: recoveries do not accumulate descriptors; while anything holds it, it is known as retired.
_retired: weakref.WeakSet[ProcessGroup] = weakref.WeakSet()


def retired_group_names() -> tuple[str, ...]:
    """Identities (`naming.group_identity`) of the groups this process retired, oldest first (for
    ``classify_failure``). Not names: a successor keeps its predecessor's name."""
    with _ledger_lock:
        return tuple(_retired_names)


def forget_retired(names: Sequence[str]) -> None:
    """A rebuilt world made groups under these names again (`membership.world`), each its own
    identity: an error that names them is about the new group, not a retired one."""
    with _ledger_lock:
        _retired_names[:] = [n for n in _retired_names if n not in set(names)]


def is_retired(pg: ProcessGroup) -> bool:
    with _ledger_lock:
        return pg in _retired


def make_group(
    ranks: Sequence[int],
    *,
    label: str,
    generation: int = 0,
    timeout: datetime.timedelta | float,
    store: Store | None = None,
    backend: str = "gloo",
    device: torch.device | None = None,
) -> ProcessGroup:
    """Build and register a group over ``ranks``; called by its members only (others: error).

    Blocks until every member has arrived, for at most ``timeout``; members may arrive at
    different times. ``store`` defaults to the default group's store. The timeout is required:
    c10d would otherwise give subgroups a 30-minute default. ``device`` binds the group as
    ``new_group(device_id=...)`` does (an indexed device; every member binds the same way).
    """
    members = normalise_ranks(ranks)
    require_member(members, "build a group")
    name = claim_name(label, generation)
    return _built_and_registered(members, name, name, store_prefix(label, generation, members), timeout, store,
                                 backend, device)


def require_member(members: Sequence[int], what: str) -> None:
    me = dist.get_rank()
    if me not in members:
        raise MembershipError(f"rank {me} is not a member of {list(members)}: only members {what}")


def claim_name(label: str, generation: int) -> str:
    """The name and identity of a group `make_group` builds for ``label`` at ``generation``,
    refused if this process has a live group of that name or identity already."""
    name = group_name(label, generation)
    if _c10d.name_is_taken(name):
        raise ValueError(f"a process group named {name!r} already exists in this process; "
                         "use a new generation for every replacement")
    claim_identity(label, generation)
    return name


def claim_identity(label: str, generation: int) -> str:
    """The identity of ``label`` at ``generation``, refused if a live group of this process has it
    or had it (the retired-group ledger): the two would share the generation's store prefix, and a
    rendezvous would read the other's keys; and an error naming the identity would read as the
    retired one's. A world rebuilt on a fresh store prefix forgets its names first (`forget_retired`)."""
    identity = group_name(label, generation)
    holder = next((pg for pg in _c10d.registered_groups() if group_identity(pg) == identity), None)
    if holder is not None:
        raise ValueError(f"the live group {holder.group_name!r} is generation {identity!r} already; "
                         "use a new generation for every replacement")
    with _ledger_lock:
        retired = identity in _retired_names
    if retired:
        raise ValueError(f"generation {identity!r} was retired in this process; use a new generation for every "
                         "replacement")
    return identity


def connect(members: list[int], *, name: str, identity: str, prefix: str, timeout: datetime.timedelta | float,
            store: Store | None, backend: str, device: torch.device | None = None) -> tuple[ProcessGroup, PrefixStore]:
    """Build a group over ``members`` (the caller is one) on the store prefix ``prefix``, named
    ``name`` and described by its ``identity``, bound to ``device`` when one is given, its
    connections recorded, not registered: `make_group` registers at once, a standby
    (`comm.standby`) when it is adopted."""
    if device is not None and device.index is None:
        raise ValueError(f"a group is bound to one indexed device (cuda:k), got {device}")
    prefixed = PrefixStore(prefix, store or _c10d.default_store())
    timeout = as_timedelta(timeout)
    group_rank = members.index(dist.get_rank())
    pg = connections.recorded(lambda: _build(members, group_rank, name, identity, prefixed, timeout, backend, device),
                              backend)
    return pg, prefixed


def retire_group(pg: ProcessGroup, *, abort: bool = False) -> bool:
    """Shut ``pg`` down and drop it from c10d (idempotent); returns whether this call retired it.

    ``abort=True`` is the NCCL route (see module docstring); several NCCL groups that failed
    together are aborted together with `retire_groups`. The group's name goes to the
    ledger that ``classify_failure`` consults; the object itself is not kept, so it is freed as
    soon as the rebind has dropped the framework's last reference to it.
    """
    if is_retired(pg):
        return False
    if _c10d.is_default_group(pg):
        raise MembershipError("refusing to retire the default process group: destroying it would tear down "
                              "every group of the job")
    identity = group_identity(pg)
    if not _c10d.is_registered(pg):
        # never registered, or destroyed behind our back: just close it, by abort when asked (an
        # NCCL shutdown finalizes: it waits for every kernel, which a dead peer never lets finish)
        pg.abort() if abort else pg.shutdown()
    elif abort:
        _c10d.abort(pg)
    else:
        _c10d.destroy(pg)
    with _ledger_lock:
        _retired.add(pg)
        _retired_names.append(identity)
    return True


def retire_groups(pgs: Sequence[ProcessGroup], *, abort: bool) -> list[bool]:
    """Retire several groups that failed together. With ``abort`` their NCCL communicators are
    aborted in one window (``_c10d.abort_together``): one after the other, with dependent work in
    flight, they can deadlock. Returns, per group, whether this call retired it."""
    fresh = [pg for pg in pgs if not is_retired(pg)]
    if any(_c10d.is_default_group(pg) for pg in fresh):
        raise MembershipError("refusing to retire the default process group: destroying it would tear down "
                              "every group of the job")
    together = [pg for pg in fresh if _c10d.is_registered(pg)] if abort else []
    if together:
        names = [group_identity(pg) for pg in together]
        _c10d.abort_together(together)
        with _ledger_lock:
            _retired.update(together)
            _retired_names.extend(names)
    aborted = {id(pg) for pg in together}
    return [True if id(pg) in aborted else retire_group(pg, abort=abort) for pg in pgs]


def replace_group(
    old: ProcessGroup,
    *,
    ranks: Sequence[int],
    label: str,
    generation: int,
    timeout: datetime.timedelta | float,
    store: Store | None = None,
    backend: str | None = None,
    abort: bool | None = None,
    standby: Standby | None = None,
) -> ProcessGroup:
    """Retire ``old`` and build its successor with identical membership, at ``generation``,
    under ``old``'s name (`comm.naming`: whatever holds the name finds the successor).

    With ``standby`` (`comm.standby`, agreed by every member) the successor is that standby,
    adopted under that name and the generation's identity instead of built.

    The successor gets ``old``'s own backends (``backend=None``: read from c10d's registry, so an
    NCCL data plane stays NCCL) and ``old`` is aborted rather than destroyed when NCCL serves it
    (``abort=None``); pass either explicitly to override. It is bound to ``old``'s device when
    ``old`` was bound (a standby must have been built bound the same way).

    Called only by the members of the failed group, all with the same ``ranks``, ``label`` and
    ``generation``. Discover references to ``old`` (``accelpact.rebind.discover``) *before*
    calling this: the rebind proof tells ``old`` from its successor by object. Membership, caller,
    name and identity are checked before ``old`` is retired. A build that times out leaves the
    store keys of its generation behind, and the name free: retry with the next generation.
    """
    members = normalise_ranks(ranks)
    known = _c10d.registered_ranks(old)
    if known is not None and known != members:
        raise MembershipError(f"replacement membership {members} differs from the failed group's {known}")
    if known is not None and old.size() != len(members):
        raise MembershipError(f"failed group has {old.size()} members, replacement would have {len(members)}")
    if dist.get_rank() not in members:
        raise MembershipError(f"rank {dist.get_rank()} is not a member of {members}: only members replace")
    timeout = as_timedelta(timeout)
    name = old.group_name
    holder = _c10d.resolve_name(name)
    if holder is not None and holder is not old:  # refuse before retiring anything
        raise ValueError(f"the name {name!r} of the group to replace belongs to another live group")
    identity = claim_identity(label, generation)
    if backend is None:
        backend = backend_spec(old)
        if backend is None:
            raise MembershipError(f"the backend of {old.group_name!r} is unknown (c10d no longer knows the group): "
                                  "pass backend= explicitly")
    device = old.bound_device_id
    if standby is not None and standby.backend != backend:
        raise MembershipError(f"the standby of {label!r} was built with {standby.backend!r}, the group it would "
                              f"succeed uses {backend!r}")
    if standby is not None and standby.device != device:
        raise MembershipError(f"the standby of {label!r} is bound to {standby.device}, the group it would succeed "
                              f"to {device}")
    if abort is None:
        abort = uses_nccl(parse_backends(backend))
    retire_group(old, abort=abort)
    if standby is not None:
        return standby.adopt(ranks=members, name=name, identity=identity, timeout=timeout)
    return _built_and_registered(members, name, identity, store_prefix(label, generation, members), timeout, store,
                                 backend, device)


def _built_and_registered(members: list[int], name: str, identity: str, prefix: str,
                          timeout: datetime.timedelta | float, store: Store | None, backend: str,
                          device: torch.device | None) -> ProcessGroup:
    pg, prefixed = connect(members, name=name, identity=identity, prefix=prefix, timeout=timeout, store=store,
                           backend=backend, device=device)
    _c10d.register_group(pg, name=name, ranks=members, store=prefixed, backend=backend)
    return pg


# --------------------------------------------------------------------------------------------


def normalise_ranks(ranks: Sequence[int]) -> list[int]:
    members = [int(r) for r in ranks]
    if not members or len(set(members)) != len(members):
        raise MembershipError(f"a group needs distinct ranks, got {list(ranks)}")
    return members


def as_timedelta(timeout: datetime.timedelta | float) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        value = timeout
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        value = datetime.timedelta(seconds=float(timeout))
    else:
        raise TypeError(f"timeout must be a timedelta or seconds, got {timeout!r}")
    if value <= datetime.timedelta(0):
        raise ValueError(f"timeout must be positive, got {value}")
    return value


def _build(
    members: list[int], group_rank: int, name: str, identity: str, prefix: PrefixStore,
    timeout: datetime.timedelta, backend: str, device: torch.device | None,
) -> ProcessGroup:
    """A ``ProcessGroup`` with one backend per device, as ``_new_process_group_helper`` builds it:
    bound first, so that every backend registered after takes the binding."""
    pg = ProcessGroup(prefix, group_rank, len(members))
    if device is not None:
        pg.bound_device_id = device
    request = BuildRequest(prefix, group_rank, len(members), timeout, members, name, torch.device("cpu"))
    build_backends(pg, parse_backends(backend), request)
    pg._set_group_name(name)
    pg._set_group_desc(identity)
    return pg
