"""Neighbour-memory replication, the effects: a sender thread and a listening socket per rank.

After each optimizer step the training thread hands the sender the *references* of what moves
(`transfer.entries`: a parameter's local shard, buffers, optimizer state; no copy) and goes on.
The sender packs them into its own buffer, hashes the bytes (SHA-256) and streams them to its
ring neighbour over a plain TCP connection, which acknowledges once every byte is in its memory.
Only the next optimizer step writes those tensors in place (buffers, which a forward writes, go as
copies taken by the training thread), so the training thread waits in that step's pre-hook until
the sender has packed them, and before a recovery restores anything; the time it waits there is
the critical-path cost (`join_wait_s`), the rest overlaps forward and backward
(`bench/replication.py`). The sender takes an offer once the copy before it is sent: where a copy
takes longer to send than an update's forward and backward, the step waits for the network too
(replication then paces training, for at most the control timeout, after which that copy is
dropped). A recovery never waits for the network (`wait_packed(drop_untaken=True)`).

Why a socket of its own, not a process group: the copy must outlive the groups a recovery
retires and rebuilds, a broken connection must only lose one copy (never a collective's
peers), and the receiver must be able to tell a complete copy from a partial one. Each frame's
header is authenticated with the control plane's per-job secret (`control.auth`), so a process
without it cannot plant a copy that a spare would adopt. It also carries the sender's incarnation
(drawn at its start) and a sequence number, both under the MAC: a holder accepts from one source
only increasing numbers of its newest incarnation, so a frame captured on the network and sent
again (the copy of F from before a Rewind, say, after the re-run's copy of F) is refused.

Memory: a receiver keeps up to `neighbour.KEEP` complete copies per source plus one arriving.

On a GPU the pack is a device-to-host copy on the sender thread's current (default) stream,
queued after the optimizer step that produced the values (the offer comes from the step's
post-hook) and finished before the next step is queued (the pre-hook waits for it); forward and
backward kernels in between only read the sharded parameters. Read, not run here.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..comm import connections
from . import keys, transfer
from .neighbour import HeldCopies, NeighbourCopy, holder_of

log = logging.getLogger("accelpact.membership")

_MAGIC = b"APN1"
#: The largest frame header a holder reads (its layout: ~60 bytes per tensor, so a million tensors).
MAX_HEADER_BYTES = 64 << 20
_ACK, _REFUSED, _UNDONE = b"K", b"R", b"U"  # taken; refused (authentication, replay); from before a recovery


def _frame_mac(sealer: Any, header: dict) -> str:
    return sealer.mac("neighbour-copy", header["source"], header["frontier"], header["nbytes"], header["digest"],
                      json.dumps(header["layout"], sort_keys=True), header.get("sender"), header.get("seq"),
                      header.get("epoch"))


def local_address(store_host: str) -> str:
    """This host's address on the route to the store's host (what a peer can reach)."""
    if store_host in ("localhost", "127.0.0.1", "::1", ""):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((store_host, 9))  # no packet is sent: this only picks the route
        return probe.getsockname()[0]
    finally:
        probe.close()


def _keep_alive(conn: socket.socket) -> None:
    """Probe an idle connection, so that a sender whose host vanished between two copies frees
    this holder's receive thread and descriptor (about 20 s) instead of never (found by review)."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError as exc:  # not a TCP socket, or a platform without the options: idle as before
        log.info("neighbour copies: no keepalive on an accepted connection: %s", exc)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray(n)
    _recv_into(conn, memoryview(out))
    return bytes(out)


def _recv_into(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"the sender closed the connection after {got} of {len(view)} bytes")
        got += n


class NeighbourReplicator:
    """This rank's side of the ring: holds its predecessor's copies, sends its own to its holder.

    `sends` is False where a replica peer holds this rank's shard already (HSDP, DDP): the copy
    would protect nothing. `world()` names the current membership world (a spare's takeover
    changes who listens at a position), `sealer()` the control plane's current authenticator."""

    def __init__(self, *, store: dist.Store, position: int, world_size: int, stride: int, sends: bool,
                 sealer: Callable[[], Any], world: Callable[[], int], timeout_s: float, store_host: str,
                 epoch: Callable[[], int] = lambda: 0):
        self.store, self.position, self.world_size, self.stride = store, position, world_size, stride
        self.sends, self._sealer, self._world, self.timeout_s = sends, sealer, world, timeout_s
        #: the job's recovery count (equal on every rank, a spare's included): a frame offered
        #: before the latest recovery may carry an update that recovery undid, and is refused
        self._epoch = epoch
        self.holder = holder_of(position, world_size, stride)
        self.held = HeldCopies()
        self._reused: list[bytearray] = []  # one evicted copy's buffer, for the next arrival
        self.hook: Any = None  # the optimizer post-hook that offers copies (`runtime.neighbours`)
        # what the sender did (the bench and rt.history read these)
        self.sent = self.bytes = self.refused = self.undone = 0
        self.pack_s = self.hash_s = self.send_s = self.join_wait_s = 0.0
        self.acked: int | None = None  # the newest frontier the holder acknowledged
        self.error = ""
        # one slot: the newest offer not yet taken by the sender (an older one it replaces is
        # never sent), and whether the sender is still reading the training thread's tensors
        self._slot = threading.Condition()
        self._next: tuple[int, list, Callable[[], dict], int] | None = None
        self._packing = False
        self._torn = False  # the training thread stopped waiting: what is being packed is void
        self._buf: torch.Tensor | None = None
        self._conn: socket.socket | None = None
        self._conn_world: int | None = None
        self._closing = False
        self._incarnation, self._seq = secrets.token_hex(8), 0  # this sender: what its frames carry
        #: the receiving side: source -> (its newest sender's incarnation, the last number taken),
        #: and every incarnation seen of it (an older one is never taken again)
        self._from: dict[int, tuple[str, int]] = {}
        self._seen: dict[int, set[str]] = {}
        self._fresh_lock = threading.Lock()  # one receive thread per connection: a reconnect races
        self._accepted: set[socket.socket] = set()  # connections accepted and still read from
        self._server = socket.create_server((local_address(store_host), 0))
        connections.service_port(self._server.getsockname()[1])  # never severed with a gloo group
        host, port = self._server.getsockname()[:2]
        store.set(keys.neighbour_address(position), json.dumps({"host": host, "port": port, "pid": os.getpid()}))
        threading.Thread(target=self._accept, name="accelpact-neighbour-accept", daemon=True).start()
        self._sender = threading.Thread(target=self._send_loop, name="accelpact-neighbour-send", daemon=True)
        self._sender.start()

    # -- the training thread ------------------------------------------------------------------
    def offer(self, frontier: int, moved: list[tuple[str, torch.Tensor]], layout: Callable[[], dict]) -> None:
        """After the optimizer step of update `frontier`: replicate `moved` (references; they are
        read by the sender until `wait_packed` returns), described by `layout()`, which the sender
        calls while it packs (the optimizer's state is not written before the next step). Never
        blocks."""
        if not self.sends:
            return
        with self._slot:
            self._next = (frontier, moved, layout, self._epoch())
            self._slot.notify_all()

    def wait_packed(self, *, drop_untaken: bool = False) -> None:
        """Block until the sender has read every tensor it was offered (they may change next).

        An offer the sender has not taken yet waits for the copy before it to be sent: between
        two optimizer steps that is the price of a copy per update (replication paces training
        when a copy takes longer to send than an update's forward and backward). A recovery does
        not pay it (`drop_untaken`): that offer is dropped, never read, and only a pack under way
        is waited for (found by review: a sender stuck on a holder that vanished held a survivor
        before its presence for up to the control timeout, which the presence grace does not
        budget)."""
        with self._slot:
            if drop_untaken and self._next is not None:
                self._next = None
            if self._next is None and not self._packing:
                return
            t = time.perf_counter()
            done = self._slot.wait_for(lambda: self._next is None and not self._packing, timeout=self.timeout_s)
            self.join_wait_s += time.perf_counter() - t
            if not done:  # the tensors change from here on: what the sender reads must not be sent
                self._torn, self._next = True, None
                log.warning("neighbour copy: packing did not finish in %.1f s; this copy is dropped",
                            self.timeout_s, extra={"position": self.position})

    # -- UpdateListener: the optimizer step and a recovery's restore write what is being read --
    def on_phase(self, update: int, phase: Any) -> None:
        if str(phase) == "optimizer":
            self.wait_packed()

    def on_recovery_step(self, update: int, step: str) -> None:
        self.wait_packed(drop_untaken=True)
        if step == "restore":  # a Rewind undoes `update`: a copy it produced must not stand for it
            self.forget_from(update)

    def forget_from(self, frontier: int) -> None:
        """Drop the held copies labelled `frontier` or later (their updates were undone; found by
        review: after a Rewind the undone update's copy kept its label until the re-run's frame
        began to arrive, and a loss in between would have handed the spare its state)."""
        self._recycle(self.held.drop_from(frontier))

    def probe_order(self, labels: list[str]) -> list[str]:
        return labels

    def before_probe(self, label: str) -> bool:
        return True

    def stop(self) -> None:
        with self._slot:
            self._closing = True
            self._slot.notify_all()
        for conn in list(self._accepted):  # a shutdown wakes the receive blocked in it; a close alone does not
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for s in (self._server, self._conn, *list(self._accepted)):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass

    def stats(self) -> dict[str, Any]:
        return {"sends": self.sends, "holder": self.holder, "sent": self.sent, "bytes": self.bytes,
                "acked": self.acked, "refused": self.refused, "undone": self.undone, "pack_s": self.pack_s,
                "hash_s": self.hash_s,
                "send_s": self.send_s, "join_wait_s": self.join_wait_s, "held": {
                    str(s): self.held.frontiers(s) for s in self.held.sources()}, "error": self.error}

    # -- the sender thread --------------------------------------------------------------------
    def _pack(self, moved: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
        """Every tensor's bytes into the sender's own buffer, in one call: each call into torch
        takes the GIL back from the training thread (a switch interval each, measured as most of a
        small copy's time), so one concatenation beats a copy per tensor."""
        parts = [t.detach().reshape(-1).view(torch.uint8) for _, t in moved]  # views (a copy if strided)
        total = sum(p.numel() for p in parts)
        if self._buf is None or self._buf.numel() != total:
            self._buf = torch.empty(total, dtype=torch.uint8)
        if parts:
            torch.cat([p.cpu() for p in parts] if any(p.device.type != "cpu" for p in parts) else parts,
                      out=self._buf)
        return self._buf

    def _take(self) -> tuple[int, list, Callable[[], dict], int] | None:
        with self._slot:
            self._slot.wait_for(lambda: self._next is not None or self._closing)
            if self._closing:
                return None
            item, self._next = self._next, None
            self._packing, self._torn = True, False
            return item

    def _send_loop(self) -> None:
        """Pack and send each offer. Whatever one copy meets (the store unreachable for the
        holder's address, a layout that does not serialise, a socket error) costs that copy
        alone: a thread that died left every later optimizer step waiting its timeout for a
        pack nobody would make (found by review)."""
        while (item := self._take()) is not None:
            frontier, moved, describe, epoch = item
            t = time.perf_counter()
            buf = layout = None
            try:
                buf, layout = self._pack(moved), describe()
            except Exception as exc:  # noqa: BLE001 - this copy is lost; the cause is kept in `error`
                self._lost(frontier, exc)
            finally:
                del moved, item, describe  # the training thread's tensors are not read after this
                with self._slot:
                    self._packing, torn = False, self._torn
                    self._slot.notify_all()
            self.pack_s += time.perf_counter() - t
            if torn or buf is None:
                continue
            try:
                self._send(frontier, buf, layout, epoch)
            except Exception as exc:  # noqa: BLE001 - one copy lost; the decision sees it is missing
                self._lost(frontier, exc)
                self._drop_connection()

    def _lost(self, frontier: int, exc: BaseException) -> None:
        self.error = f"copy of F={frontier} to rank {self.holder}: {type(exc).__name__}: {exc}"
        log.warning("neighbour copy failed: %s", self.error, extra={"position": self.position})

    def _send(self, frontier: int, buf: torch.Tensor, layout: dict, epoch: int = 0) -> None:
        t = time.perf_counter()
        data = buf.numpy()
        self._seq += 1
        header = {"source": self.position, "frontier": int(frontier), "nbytes": int(buf.numel()),
                  "digest": transfer.digest(buf), "layout": layout, "sender": self._incarnation, "seq": self._seq,
                  "epoch": int(epoch)}
        header["mac"] = _frame_mac(self._sealer(), header)
        self.hash_s += time.perf_counter() - t
        t = time.perf_counter()
        conn = self._connection()
        # a socket timeout bounds all of `sendall`, not each chunk: a shard that takes longer than
        # the control timeout to stream failed on every update (found by review); bound it by size
        conn.settimeout(transfer.transfer_timeout_s(int(buf.numel()), self.timeout_s))
        raw = json.dumps(header).encode()
        conn.sendall(_MAGIC + struct.pack(">I", len(raw)) + raw)
        conn.sendall(memoryview(data))
        answer = _recv_exact(conn, 1)
        self.send_s += time.perf_counter() - t
        if answer == _UNDONE:  # a recovery came between the offer and the holder: this copy is void
            self.undone += 1
            raise ValueError(f"rank {self.holder} dropped the copy of F={frontier}: offered before the latest recovery")
        if answer != _ACK:
            self.refused += 1
            raise ValueError(f"rank {self.holder} refused the copy (authentication)")
        self.sent += 1
        self.bytes = int(buf.numel())
        self.acked, self.error = int(frontier), ""

    def _connection(self) -> socket.socket:
        world = self._world()
        if self._conn is not None and self._conn_world == world:
            return self._conn
        self._drop_connection()
        where = json.loads(self.store.get(keys.neighbour_address(self.holder)))
        connections.service_port(int(where["port"]))
        conn = socket.create_connection((where["host"], int(where["port"])), timeout=self.timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn, self._conn_world = conn, world
        return conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        self._conn = self._conn_world = None

    # -- the receiving side -------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed by stop()
            self._accepted.add(conn)  # stop() closes it: a receive blocked in it then ends
            _keep_alive(conn)
            threading.Thread(target=self._receive_loop, args=(conn,), name="accelpact-neighbour-recv",
                             daemon=True).start()

    def _receive_loop(self, conn: socket.socket) -> None:
        try:
            self._receive_all(conn)
        finally:
            self._accepted.discard(conn)

    def _receive_all(self, conn: socket.socket) -> None:
        with conn:
            while not self._closing:
                try:
                    if not self._receive_one(conn):
                        return
                except (OSError, ValueError, KeyError, ConnectionError) as exc:  # the partial copy is dropped
                    if not self._closing:
                        log.info("neighbour copy from a peer ended: %s: %s", type(exc).__name__, exc,
                                 extra={"position": self.position})
                    return

    def _receive_one(self, conn: socket.socket) -> bool:
        conn.settimeout(None)  # idle between copies: a sender offers one per update
        first = conn.recv(4)
        if not first:
            return False  # the sender closed between copies
        conn.settimeout(self.timeout_s)  # inside a frame: a sender that vanished must not hold this thread
        magic = first + _recv_exact(conn, 4 - len(first)) if len(first) < 4 else first
        if magic != _MAGIC:
            raise ValueError(f"not a neighbour copy frame: {magic!r}")
        (length,) = struct.unpack(">I", _recv_exact(conn, 4))
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"a neighbour copy header of {length} bytes (at most {MAX_HEADER_BYTES})")
        header = json.loads(_recv_exact(conn, length))
        source, frontier = int(header["source"]), int(header["frontier"])
        authentic = hmac.compare_digest(str(header.get("mac", "")), _frame_mac(self._sealer(), header))
        why = "its header fails authentication" if not authentic else self._stale(source, header)
        undone = "" if why else self._undone(header)
        if why or undone:  # refused before its body is read or any memory is given to it
            conn.sendall(_UNDONE if undone else _REFUSED)
            why = why or undone
            log.warning("refused a neighbour copy claiming rank %d at F=%d: %s", source, frontier, why,
                        extra={"position": self.position})
            return False  # the connection closes: its body is never read
        nbytes = int(header["nbytes"])
        self._recycle(self.held.begin(source, frontier))
        data = self._reused.pop() if self._reused and len(self._reused[-1]) == nbytes else bytearray(nbytes)
        _recv_into(conn, memoryview(data))
        why = self._undone(header)  # a recovery may have come while the body arrived
        if why:
            self._recycle([NeighbourCopy(source, frontier, "", {}, data)])
            conn.sendall(_UNDONE)
            log.info("dropped a neighbour copy of rank %d at F=%d: %s", source, frontier, why,
                     extra={"position": self.position})
            return False
        self._recycle(self.held.complete(NeighbourCopy(source=source, frontier=frontier,
                                                       digest=str(header["digest"]), layout=header["layout"],
                                                       data=data, seq=int(header["seq"]))))
        conn.sendall(_ACK)
        return True

    def _undone(self, header: dict) -> str:
        """Why an authentic, fresh frame cannot be held ("" when it can): offered before this
        job's latest recovery, it may carry an update that recovery undid."""
        epoch, now = header.get("epoch"), self._epoch()
        if not isinstance(epoch, int) or epoch < now:
            return f"it was offered before recovery {now} (epoch {epoch!r}): its update may have been undone"
        return ""

    def _stale(self, source: int, header: dict) -> str:
        """Why an authentic frame is not fresh ("" when it is), taking its number when it is."""
        sender, seq = str(header.get("sender", "")), header.get("seq")
        if not isinstance(seq, int):
            return "it carries no sequence number"
        with self._fresh_lock:
            newest, last = self._from.get(source, ("", 0))
            seen = self._seen.setdefault(source, set())
            if sender != newest and sender in seen:
                return f"it comes from an earlier sender of rank {source} (a replayed frame)"
            if sender == newest and seq <= last:
                return f"its number {seq} is not above {last}, the last taken from rank {source} (a replayed frame)"
            seen.add(sender)
            self._from[source] = (sender, seq)
        return ""

    def _recycle(self, gone: list[NeighbourCopy]) -> None:
        """Keep one evicted copy's memory for the next arrival: a fresh 100 MB buffer costs its
        page faults again on every copy. An evicted copy is never one a transfer reads (that is
        of the agreed frontier, among the newest kept)."""
        for copy in gone:
            if not self._reused:
                self._reused.append(copy.data)
