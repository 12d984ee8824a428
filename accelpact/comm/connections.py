"""Each gloo group's own TCP connections, so that a rank leaving a retired world can close them.

Why: when a member is lost, the rank that learns of it first leaves for the membership change,
but its peers may sit inside the framework's own collectives with it (FSDP's all-gather, the
replicate all-reduce). Those waits are c10d's, not ours: nothing can cut them short (gloo work
cannot be aborted from another thread, pytorch#130345; ``abort``/``shutdown`` of a gloo group
keeps its sockets open while the framework still holds the group), so each peer would wait out
the data timeout. Closing this rank's connections of that world makes every peer's pending
receive fail with "Connection closed by peer" at once, and the failure cascades at socket speed.

How: a group's connections are the sockets that appeared in this process while it was built
(gloo connects its full mesh in the group's constructor): c10d's groups (`track`) and
AccelPact's own (`lifecycle.make_group`). They are recorded then, as (fd, inode) pairs, and shut
down (``shutdown(SHUT_RDWR)`` on a duplicate: the connection closes for every descriptor of it,
while gloo's own descriptor stays valid and its pair reports the error) only if the descriptor
still names the same socket. Listening sockets are never touched: gloo's event loop treats an
error on its listener as fatal (terminate), measured. Each recorded connection also gets its
retransmission back-off capped (`_cap_retransmit`), so a collective stalled across a cut link
resumes soon after the link returns.

Not recorded either: connections to or from AccelPact's own services (neighbour replication, link
probing; `service_port`), which their threads may open while a group is being built: severed with
the group, a replication connection would break for nothing. Ports are compared by number, so a
gloo connection that shares a number with a service port on another host is left open too (its
peer then waits the data timeout, as without severing).

Not recorded: groups with an NCCL backend (NCCL may build its communicator eagerly, and its
sockets are its own; NCCL groups are aborted instead), groups built before tracking began, and
everything without the kernel's ``/proc`` view of descriptors (`sever` then closes nothing and
says so).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch.distributed import ProcessGroup

from . import _c10d
from .naming import group_identity

log = logging.getLogger("accelpact.comm")

_FD_DIR = "/proc/self/fd"
_lock = threading.Lock()
_by_group: dict[int, tuple[str, tuple[tuple[int, str], ...]]] = {}  # id(pg) -> (name, ((fd, "socket:[ino]"), ...))
#: listening ports of AccelPact's own services, here and on peers (set.add is atomic: no lock, so
#: a service thread never waits for a group build that holds `_lock`)
_service_ports: set[int] = set()


def service_port(port: int) -> None:
    """`port` listens for one of AccelPact's own services (registered before any connection to or
    from it opens): such a connection is never recorded as a group's."""
    _service_ports.add(int(port))


def _is_service_connection(fd: int, target: str) -> bool:
    with _connection(fd, target) as sock:
        if sock is None:
            return False
        try:
            ports = {sock.getsockname()[1], sock.getpeername()[1]}
        except OSError:  # not connected (any more): nothing to sever either
            return False
    return bool(ports & _service_ports)


@dataclass
class Severed:
    """What `sever` did: connections closed per group name, and groups it could not close, why."""

    closed: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.closed.values())


def _sockets() -> dict[int, str]:
    """This process's socket descriptors: fd -> "socket:[inode]" (empty without /proc)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:  # closed while listing
            continue
        if target.startswith("socket:"):
            out[int(name)] = target
    return out


def recorded(build: Callable[[], Any], backend: str, group_of: Callable[[Any], Any] = lambda built: built):
    """Call `build` (which constructs a group) and record the sockets it opened for that group;
    `group_of` picks the group out of what `build` returns. Groups with NCCL are not recorded."""
    if "nccl" in backend.lower():
        return build()
    with _lock:  # two groups built at once by two threads would mix their sockets
        before = _sockets()
        built = build()
        opened = tuple(sorted((fd, target) for fd, target in _sockets().items()
                              if before.get(fd) != target and not _is_service_connection(fd, target)))
        pg = group_of(built)
        if isinstance(pg, ProcessGroup):  # a non-member gets a sentinel and opens nothing
            _by_group[id(pg)] = (group_identity(pg), opened)
            # dropped with the group (found by review: one entry per group ever built, kept forever;
            # a retired group still held may yet be severed, so not at retirement)
            weakref.finalize(pg, _by_group.pop, id(pg), None)
            for fd, target in opened:
                _cap_retransmit(fd, target)
    return built


#: Linux >= 6.15: the longest wait between two retransmissions of a connection (TCP_RTO_MAX_MS;
#: the kernel accepts 1000..120000 ms, default 120000).
TCP_RTO_MAX_MS = 44
RETRANSMIT_CAP_MS = 1000
retransmit_cap: dict[str, object] = {"capped": 0, "unsupported": ""}


@contextmanager
def _connection(fd: int, target: str) -> Iterator[socket.socket | None]:
    """A duplicate of `fd` as a socket, if `fd` still names `target` and is a TCP connection (not
    a listener); None otherwise. Closing the duplicate leaves gloo's descriptor open."""
    try:
        if os.readlink(f"{_FD_DIR}/{fd}") != target:
            yield None  # closed, and the number reused: not ours any more
            return
        dup = os.dup(fd)
    except OSError:
        yield None
        return
    with socket.socket(fileno=dup) as sock:
        connected = (sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
                     and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        yield sock if connected else None


def _cap_retransmit(fd: int, target: str) -> None:
    """Bound a group connection's retransmission back-off to 1 s. Why: a collective that waits
    across a cut link retransmits at doubling intervals (0.2, 0.4, 0.8, 1.6, 3.2 s ...); when the
    link returns it stays silent until the next one. Measured in `make chaos`: the control
    plane's boundary check returned 0.93-0.98 s after a 4.6 s cut was restored (0.04-0.05 s after
    a 2.55 s one); 0.29 s with the cap. Kernels without the option keep their back-off
    (`retransmit_cap["unsupported"]` says why)."""
    if retransmit_cap["unsupported"]:
        return
    with _connection(fd, target) as sock:
        if sock is None:
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, RETRANSMIT_CAP_MS)
        except OSError as exc:  # ENOPROTOOPT / EINVAL: a kernel before 6.15
            retransmit_cap["unsupported"] = f"TCP_RTO_MAX_MS refused by this kernel: {exc}"
            log.info("accelpact cannot cap TCP retransmission back-off: %s", exc)
            return
    retransmit_cap["capped"] = int(retransmit_cap["capped"]) + 1


def _c10d_helper(helper, *args, **kwargs):
    backend = str(args[3] if len(args) > 3 else kwargs.get("backend", ""))
    return recorded(lambda: helper(*args, **kwargs), backend, group_of=lambda built: built[0])


def track() -> None:
    """From now on, record the connections of every group c10d builds in this process."""
    _c10d.around_group_construction(_c10d_helper)


def connections_of(pg) -> tuple[tuple[int, str], ...]:
    """The (fd, "socket:[inode]") pairs recorded for `pg` (empty if it was not recorded)."""
    entry = _by_group.get(id(pg))
    if entry is None or entry[0] != group_identity(pg):  # an id reused by a later group: not its record
        return ()
    return entry[1]


def renamed(pg, identity: str) -> None:
    """`pg` is the generation `identity` from now on (a standby adopted as a generation's group):
    its recorded connections follow it."""
    with _lock:
        entry = _by_group.get(id(pg))
        if entry is not None:
            _by_group[id(pg)] = (identity, entry[1])


def intact(pg) -> bool:
    """Whether every connection recorded for `pg` is still open, as far as this process can see
    without using it: the descriptor still names the socket recorded, and the socket is neither
    hung up nor at end of stream (a peek, which consumes nothing). For a group nobody uses yet (a
    standby, `comm.standby`) a closed connection is a peer that went away, and gloo closes a
    connection its peer closed (measured: the descriptor is gone). Data waiting to be read is not
    taken as a close. True when nothing was recorded (no /proc, NCCL): then nobody can tell here,
    and the validation after the group is adopted is what finds it."""
    for fd, target in connections_of(pg):
        try:
            if os.readlink(f"{_FD_DIR}/{fd}") != target:
                return False
        except OSError:
            return False
        with _connection(fd, target) as sock:
            if sock is not None and _closed(sock):  # None: a listener, or not TCP: nothing to ask
                return False
    return True


def local_addresses(pg) -> set[str]:
    """The local IP addresses of `pg`'s recorded connections: the address this rank's peers reach
    it at over that group (`control.reach` listens there). Empty when nothing was recorded."""
    out: set[str] = set()
    for fd, target in connections_of(pg):
        with _connection(fd, target) as sock:
            if sock is not None:
                try:
                    out.add(str(sock.getsockname()[0]))
                except OSError:  # closed meanwhile: it says nothing
                    continue
    return out


def _closed(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLRDHUP)  # POLLERR and POLLHUP are always reported
    if poller.poll(0):
        return True
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:  # open, nothing to read
        return False
    except OSError:  # reset, or another error the kernel holds for it
        return True


def _shut(fd: int, target: str) -> bool:
    """Shut down the connection behind `fd` if it is still `target` and connected."""
    with _connection(fd, target) as sock:
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # not connected (any more): nothing to close
            return False
    return True


def sever(groups: Iterable) -> Severed:
    """Close this process's connections of `groups` (a retired world's: none of them is used
    again), so that peers waiting on this rank in them fail at once instead of at their timeout."""
    done = Severed()
    for pg in groups:
        name = group_identity(pg)
        recorded = connections_of(pg)
        if not recorded:
            done.skipped[name] = "no connections recorded (built before tracking, NCCL, or no /proc)"
            continue
        done.closed[name] = sum(_shut(fd, target) for fd, target in recorded)
    log.info("accelpact severed the retired world's connections", extra={"closed": done.closed,
                                                                          "skipped": done.skipped})
    return done
