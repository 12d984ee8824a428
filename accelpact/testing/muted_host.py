"""A stand-in for a peer host behind a cut link, for tests on one machine: it answers no fresh
connection until it is unmuted.

How: a listener with an accept queue of one, filled by a connection of our own and never
accepted while muted. Linux drops a SYN that meets a full accept queue, so a probe hears nothing,
as across a cut link; unmuting accepts the filler, and the next fresh connection gets through
(the connections tried meanwhile are given up by the prober each round, as they would be)."""

from __future__ import annotations

import socket
import threading

from ..control.reach import accept_and_close


class MutedHost:
    def __init__(self, host: str = "127.0.0.1"):
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((host, 0))
        self._listener.listen(0)
        self.address: tuple[str, int] = (host, int(self._listener.getsockname()[1]))
        self._filler = socket.create_connection(self.address, timeout=2.0)  # the queue is full now
        self._timer: threading.Timer | None = None
        self.unmuted = threading.Event()

    def unmute(self) -> None:
        """From now on every fresh connection gets through (accepted and closed at once)."""
        if self.unmuted.is_set():
            return
        self.unmuted.set()
        threading.Thread(target=accept_and_close, args=(self._listener,), name="muted-host", daemon=True).start()

    def unmute_after(self, seconds: float) -> None:
        """`unmute` in `seconds` (once: later calls keep the first timer)."""
        if self._timer is None:
            self._timer = threading.Timer(seconds, self.unmute)
            self._timer.daemon = True
            self._timer.start()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._filler.close()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
