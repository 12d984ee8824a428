"""Fresh-connection probing: does each peer host answer a new TCP connection, i.e. is the link to
it up now?

Why: a collective posted while a link is cut sits in TCP retransmission back-off. Once the link
returns it resumes only at its next retransmission: up to 1 s later with the cap
`comm.connections` sets (`bench/link_return.py`: 0.31 s median after a port-block, 0.86 s after a
switch-side link-down). Nothing done to the stalled connection from user space makes it send
sooner (measured there, `--kicks`), while a fresh connection gets through at once (0.01-0.07 s).
So a rank that saw a data-plane failure does not send its boundary check into a link that may be
down: it probes its control-plane peers' hosts first, and sends once each answered or its budget
ran out (`runtime.link_wait`; the budget is `fsm.link_wait`).

What is probed: every rank listens (`ReachListener`) on the address its control-plane
connections use, and publishes it in the store at attach (`publish`). A link is a host's, not a
rank's, so the table keeps one listener per remote host: the lowest rank's there. A connection
accepted or refused (a reset) both prove the host reachable; only silence within the round, or an
unreachable network, says it is not. The listener accepts and closes at once on a thread of its
own, so its backlog never fills and no probe is dropped for that. A host that does not answer at
attach, when its link is taken to be up, is left out (`answering`): a firewall that drops the
probe port must not turn every wait for links into a wait for its whole budget.
"""

from __future__ import annotations

import datetime
import errno
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..comm import connections

log = logging.getLogger("accelpact.control")

#: Pending connections a listener holds before it accepts them (probes from every peer at once).
LISTEN_BACKLOG = 1024
#: connect() outcomes that prove the host answered: connected, or refused by its kernel.
#: A reset or abort is the host's kernel speaking too (a listener that closed with the probe queued).
_ANSWERED = (0, errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED)
#: Only EINPROGRESS means "sent, not yet answered": EAGAIN from connect() (no local port free) sent
#: nothing, and poll() would then report the unconnected socket writable with no error.
_IN_PROGRESS = (errno.EINPROGRESS,)
#: Connections one round has in flight at most (the rest of the round's hosts wait for the next
#: slice): a table of one host per rank at 1,000 ranks must not open 999 descriptors at once.
MAX_IN_FLIGHT = 256
#: How often a probe asks `stop()` (which may be a store round trip) whether to give up.
STOP_POLL_S = 0.05
#: How long a host gets at attach to answer its first probe (`answering`).
ATTACH_PROBE_S = 1.0
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER 0: a probe leaves no TIME_WAIT behind


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


#: accept() errors that say the listener is gone (shut down by `ReachListener.close`, or closed):
#: every other error is a moment's shortage (descriptors, buffers) or one aborted handshake.
_LISTENER_GONE = (errno.EINVAL, errno.EBADF, errno.ENOTSOCK)
#: How long the accept loop rests after a shortage before it accepts again.
_SHORTAGE_PAUSE_S = 0.01


def accept_and_close(listener: socket.socket) -> None:
    """Accept every connection to `listener` and close it at once, until the listener is shut down:
    a probe needs only the handshake. A shortage (no descriptor for the accepted connection, no
    buffer) pauses the loop, never ends it: a listener whose loop ended keeps completing handshakes
    into its backlog until it is full, and from then on every probe of this host would go
    unanswered for the life of the plane."""
    warned = False
    while True:
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            if exc.errno in _LISTENER_GONE or listener.fileno() < 0:
                return
            if exc.errno in (errno.ECONNABORTED, errno.EPROTO):  # one probe gave up before we took it
                continue
            if not warned:
                log.warning("accelpact's link-probe listener cannot accept (%s); retrying every %.0f ms",
                            exc, _SHORTAGE_PAUSE_S * 1e3)
                warned = True
            time.sleep(_SHORTAGE_PAUSE_S)
            continue
        conn.close()


class ReachListener:
    """A listening socket that accepts and closes every connection: what peers' probes reach."""

    def __init__(self, host: str):
        self._sock = socket.socket(_family(host), socket.SOCK_STREAM)
        try:
            self._sock.bind((host, 0))
            self._sock.listen(LISTEN_BACKLOG)
        except OSError:
            self._sock.close()
            raise
        self.address: tuple[str, int] = (host, int(self._sock.getsockname()[1]))
        connections.service_port(self.address[1])  # a probe is no gloo group's connection
        self._thread = threading.Thread(target=accept_and_close, args=(self._sock,), name="accelpact-reach",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:  # not listening any more: nothing to wake
            pass
        self._sock.close()
        self._thread.join(timeout=1.0)


@dataclass(frozen=True)
class LinkTable:
    """Where each remote host of a group takes probes: host -> (host, port); this rank's own host
    is left out (its peers there share no link with it that a cut could take)."""

    own: str
    targets: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    #: hosts left out because they did not answer at attach (`answering`); a rebuilt plane keeps
    #: them out without asking again (each ask waits out its whole budget)
    silent: frozenset[str] = frozenset()


def parse_addresses(addresses: Sequence[str], rank: int) -> LinkTable:
    """The table from every rank's published "host:port" (in rank order; "" where a rank does not
    listen). Pure: no sockets."""
    def split(address: str) -> tuple[str, int] | None:
        host, _, port = address.rpartition(":")
        return (host.strip("[]"), int(port)) if host and port.isdigit() else None

    mine = split(addresses[rank]) if 0 <= rank < len(addresses) else None
    own = mine[0] if mine else ""
    targets: dict[str, tuple[str, int]] = {}
    for r, address in enumerate(addresses):
        parsed = split(address)
        if r != rank and parsed is not None and parsed[0] != own:
            targets.setdefault(parsed[0], parsed)
    return LinkTable(own, targets)


@dataclass(frozen=True)
class Probed:
    """One probe of a link table: the hosts that answered, those that did not before the budget
    ran out, how long it took and how many rounds of fresh connections it sent."""

    reached: tuple[str, ...]
    unreached: tuple[str, ...]
    waited_s: float
    rounds: int


def probe(targets: Mapping[str, tuple[str, int]], *, budget_s: float, interval_s: float,
          stop: Callable[[], bool] | None = None) -> Probed:
    """Probe every target with a fresh connection each round (`interval_s` apart; a connection that
    has not answered by the round's end is dropped, because a SYN lost to a cut is retried by the
    kernel only 1 s later) until all answered, `budget_s` has passed or `stop()` says this wait is
    pointless (its world is being abandoned; asked every `STOP_POLL_S`, since it may be a store
    round trip); at least one round. No round waits past the budget, except the first, which
    always gets its connections a full interval: the wait ends within one interval of the budget."""
    start = time.monotonic()
    deadline = start + max(0.0, budget_s)
    todo, reached, rounds = dict(targets), [], 0
    next_stop_poll = start + STOP_POLL_S
    while todo:
        rounds += 1
        round_start = time.monotonic()
        answered = _round(todo, interval_s, None if rounds == 1 else deadline)
        reached += sorted(answered)
        for host in answered:
            del todo[host]
        now = time.monotonic()
        if not todo or now >= deadline:
            break
        if stop is not None and now >= next_stop_poll:
            next_stop_poll = now + STOP_POLL_S
            if stop():
                break
        time.sleep(max(0.0, min(round_start + interval_s, deadline) - time.monotonic()))
    return Probed(tuple(reached), tuple(sorted(todo)), time.monotonic() - start, rounds)


def _round(targets: Mapping[str, tuple[str, int]], window_s: float, deadline: float | None) -> set[str]:
    """One fresh connection to each target, `MAX_IN_FLIGHT` at a time; each slice's connections
    get `window_s` from the moment the slice was sent (not from the round's start: sending a slice
    to many hosts on a busy machine can take longer than the window), cut at `deadline` when one is
    given, and are always looked at once. Returns the hosts that answered."""
    answered: set[str] = set()
    items = list(targets.items())
    for first in range(0, len(items), MAX_IN_FLIGHT):
        answered |= _slice(items[first:first + MAX_IN_FLIGHT], window_s, deadline)
        if deadline is not None and time.monotonic() >= deadline:
            break
    return answered


def _slice(targets: Sequence[tuple[str, tuple[str, int]]], window_s: float, deadline: float | None) -> set[str]:
    answered: set[str] = set()
    pending: dict[int, tuple[str, socket.socket]] = {}
    poller = select.poll()
    try:  # every socket opened here is closed here, also when opening the next one fails
        for host, address in targets:
            connections.service_port(address[1])
            sock = socket.socket(_family(address[0]), socket.SOCK_STREAM)
            pending[sock.fileno()] = (host, sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            sock.setblocking(False)
            outcome = sock.connect_ex(address)
            if outcome in _IN_PROGRESS:
                poller.register(sock.fileno(), select.POLLOUT)
                continue
            del pending[sock.fileno()]
            if outcome in _ANSWERED:
                answered.add(host)
            sock.close()  # ENETUNREACH, EHOSTUNREACH...: not this round
        end = time.monotonic() + window_s
        if deadline is not None:
            end = min(end, deadline)
        while pending:
            events = poller.poll(max(0, int((end - time.monotonic()) * 1000)))  # poll(0) at least once
            for fd, _ in events:
                host, sock = pending.pop(fd)
                poller.unregister(fd)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) in _ANSWERED:
                    answered.add(host)
                sock.close()
            if time.monotonic() >= end:
                break
    finally:
        for _, sock in pending.values():
            sock.close()
    return answered


def listen_address(group) -> str | None:
    """The address to take probes at: the local address of `group`'s recorded connections (a
    non-loopback one first). None when none was recorded (the group was built before
    `connections.track`, or without /proc): then this rank cannot be probed."""
    addresses = connections.local_addresses(group)
    if not addresses:
        return None
    return sorted(addresses, key=lambda a: (a.startswith("127.") or a == "::1", a))[0]


def publish(store, group, rank: int, world_size: int, timeout: datetime.timedelta,
            silent: frozenset[str] = frozenset()) -> tuple[ReachListener | None, LinkTable]:
    """Start this rank's listener, publish its address in `store`, read every rank's (waiting for
    them up to `timeout`). A rank that cannot listen publishes "" and is not probed; a table that
    cannot be read is empty (nobody is probed), and both are logged: probing is a shortcut, never
    a condition of recovery. `silent`: hosts an earlier plane of this job found silent, left out
    without being asked again (a membership change would otherwise wait a second for them)."""
    listener: ReachListener | None = None
    host = listen_address(group)
    if host is not None:
        try:
            listener = ReachListener(host)
        except OSError as exc:
            log.warning("accelpact cannot listen for link probes on %s: %s", host, exc)
    mine = f"{listener.address[0]}:{listener.address[1]}" if listener is not None else ""
    keys = [f"reach/{r}" for r in range(world_size)]
    try:
        store.set(keys[rank], mine)
        store.wait(keys, timeout)
        addresses = [bytes(v).decode() for v in store.multi_get(keys)]
    except (RuntimeError, ValueError, OSError) as exc:  # DistStoreError/DistNetworkError are RuntimeErrors
        log.warning("accelpact link-probe table unreadable, no link will be probed: %s: %s",
                    type(exc).__name__, exc)
        return listener, LinkTable(host or "")
    table = parse_addresses(addresses, rank)
    table = LinkTable(table.own, {h: a for h, a in table.targets.items() if h not in silent}, silent)
    try:
        return listener, answering(table)
    except OSError as exc:  # no socket to probe with (descriptors exhausted...): then no probing at all
        log.warning("accelpact could not probe its peer hosts at attach, no link will be probed: %s: %s",
                    type(exc).__name__, exc)
        return listener, LinkTable(table.own, silent=silent)


def answering(table: LinkTable, budget_s: float = ATTACH_PROBE_S) -> LinkTable:
    """`table` without the hosts that do not answer a probe now, while every link is taken to be
    up (at attach): a firewall that drops connections to the probe port would otherwise make every
    wait for links last its whole budget. Each host left out is logged."""
    if not table.targets:
        return table
    probed = probe(table.targets, budget_s=budget_s, interval_s=min(0.05, budget_s))
    if probed.unreached:
        log.warning("accelpact will not probe hosts %s before a boundary check: they did not answer a fresh "
                    "connection at attach within %.1fs (a firewall on the probe port?)",
                    ",".join(probed.unreached), budget_s)
    return LinkTable(table.own, {h: a for h, a in table.targets.items() if h in probed.reached},
                     table.silent | frozenset(probed.unreached))
