"""The store keys of membership change, in one place (every writer and reader uses these).

All live under the job's own prefix (`launch.job_store`): they outlive every world, which the
default group's store, re-prefixed at each rebuild, does not."""

from __future__ import annotations


def spare_alive(spare: int) -> str:
    return f"membership/spare/{spare}/alive"


def spare_claim(spare: int) -> str:
    return f"membership/spare/{spare}/claim"


def spares_registered() -> str:
    return "membership/spares"


def job_end() -> str:
    return "membership/end"


def positions_done() -> str:
    return "membership/done"


def lost_total() -> str:
    """How many positions were declared lost over the job (each decision adds its own)."""
    return "membership/lost-total"


def fenced_total() -> str:
    """How many of those were alive and exited on learning it (their agents finish normally)."""
    return "membership/fenced-total"


def holder(position: int) -> str:
    """The launch rank of the process holding `position` now (its spare's, once replaced)."""
    return f"membership/holder/{position}"


def agent_of(launch_rank: int) -> str:
    """The torchrun agent (GROUP_RANK) that started launch rank `launch_rank`."""
    return f"membership/agent/{launch_rank}"


def shrunk() -> str:
    """Set (to the world it built) once a shrink was decided: no spare is offered after it."""
    return "membership/shrunk"


def lost_holders() -> str:
    """The launch ranks of the processes declared lost, appended "r," by each decision."""
    return "membership/lost-holders"


def fenced_holders() -> str:
    """The launch ranks of those that were alive and exited on learning it, appended "r,"."""
    return "membership/fenced-holders"


def heartbeat(world: int, position: int) -> str:
    """`position`'s pulse in `world`. Per world, because a position changes holders: a process
    declared lost but still alive (cut off, fenced only once it next reads the store) keeps beating
    under its old world, and under a key of the position alone those beats would hide its
    successor's death from the next change's watch."""
    return f"membership/world{world}/heartbeat/{position}"


def changing(world: int) -> str:
    return f"membership/world{world}/changing"


def present(world: int, position: int) -> str:
    return f"membership/world{world}/present/{position}"


def decision(world: int) -> str:
    return f"membership/world{world}/decision"


def digest(world: int, lost: int, holder: int) -> str:
    return f"membership/world{world}/digest/{lost}/{holder}"


def taken_in(world: int, position: int) -> str:
    """Set by the spare that took `position` over in `world` once it holds the lost rank's state,
    or gave up ("ok" / "failed"): the survivors wait for it before they probe the new groups."""
    return f"membership/world{world}/taken_in/{position}"


def receiving(world: int, position: int) -> str:
    """Set by the spare taking `position` over in `world` as it starts receiving: how long its
    receive may take (seconds), so that the survivors wait for it that much longer."""
    return f"membership/world{world}/receiving/{position}"


def vote(world: int, position: int) -> str:
    return f"membership/world{world}/vote/{position}"


def release(world: int) -> str:
    return f"membership/world{world}/release"


def small_state(world: int, position: int, frontier: int) -> str:
    """One of `position`'s two small-state slots in `world`: the one of `frontier`'s parity. Two,
    because a rank writes its state of F+1 before the boundary check of F+1 while its peers may
    still need that of F (nobody committed F+1). Per world, because a position changes holders: a
    fenced process still alive could otherwise overwrite its successor's slot with its own state."""
    return f"membership/world{world}/small/{position}/{frontier % 2}"


def neighbour_address(position: int) -> str:
    """Where `position`'s holder of neighbour copies listens (host:port, JSON); a spare that takes
    the position over writes its own."""
    return f"membership/neighbour/{position}"


def world_prefix(world: int) -> str:
    """The default group of world `world` keys its rendezvous under this prefix."""
    return f"world{world}/"
