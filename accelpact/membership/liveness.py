"""A death certificate: whether the process that held a position is gone, seen from its host.

Why: a silent heartbeat proves a loss only after 2.5 beats (1.25 s at the default 0.5 s), and a
survivor pays that before it may post that a member is lost, on every loss. But a peer on the
same host can look the process up: its pid gone, a zombie, or the pid reused by another process
(its start time differs) is a dead process, certain at once. Each heartbeat carries its process's
identity and the world it beats in (`beat_value`), so a survivor can certify the holder of a
silent position without another store key, and never from a beat of an earlier world (a shrink
renumbers positions: a stale beat may name a process that left). From another host, or another
PID or network namespace, nothing can be certified (`None`): the heartbeat's silence decides.
"""

from __future__ import annotations

import os
from functools import cache


def _where() -> str:
    """`_where_of` for this process (recomputed after a fork or a namespace change: cheap)."""
    return _where_of(os.getpid())


@cache
def _where_of(pid: int) -> str:
    """This host's boot, PID namespace and network namespace: pids compare only inside one PID
    namespace, and processes in different network namespaces count as different hosts (the chaos
    nodes are network namespaces of one machine: a node loss there is certified no faster than on
    real, separate nodes)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}:{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return ""  # no /proc: nothing can be certified here or by peers


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None if
    it does not exist; "Z" for a zombie or a dead entry (its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
    return "Z" if fields[0] in ("Z", "X", "x") else fields[19]


def identity() -> str:
    """This process, as a peer on its host can find it again: where/pid/start time. Keyed by
    pid, so that a forked child never carries its parent's identity (a parent that exits would
    otherwise have its living child certified dead)."""
    return _identity_of(os.getpid())


@cache
def _identity_of(pid: int) -> str:
    return f"{_where_of(pid)}/{pid}/{_start_time(pid)}"


def beat_value(beat: int, world: int) -> str:
    return f"{beat}|{world}|{identity()}"


def is_dead(value: bytes | str | None, world: int) -> bool | None:
    """Whether the process whose heartbeat `value` this is, beating in `world`, is gone: True
    (certain), False (it runs), None (cannot tell from here: another host, another world's beat,
    an old-format beat, no /proc)."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    parts = text.split("|", 2)
    if len(parts) != 3 or parts[1] != str(world) or not _where():
        return None
    found = parts[2].rsplit("/", 2)
    if len(found) != 3:  # garbled: no certificate (a beat that does not move still counts as silence)
        return None
    where, pid, started = found
    if where != _where() or not pid.isdigit():
        return None
    now = _start_time(int(pid))
    return now is None or now == "Z" or now != started
