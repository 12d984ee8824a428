"""Rebuild the world around a spare: re-initialise the default group on a fresh store prefix,
then re-create the job's groups under the names the job's script gave them.

Why the names: a new process is no member of the old default group, so the world must be
re-initialised (destroying every group; c10d then counts group names from 0 again). The spare
runs the user's script unchanged, and its ``init_device_mesh`` / ``new_group`` calls name their
groups "1", "2", ... by c10d's counter. Each survivor replays the groups it was a member of at
attach (`GroupRecipe`, recorded then) under exactly those names, so both sides meet on the same
store keys; a DeviceMesh that caches group *names* then resolves them to the rebuilt groups, and
the rebind writes the new objects everywhere else. Groups a script makes after attach are not
known to the spare's script at its attach point, so they are not replayed (see the README)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from ..comm import _c10d
from ..comm.lifecycle import forget_retired, make_group, parse_group_name
from ..errors import ConfigError
from . import keys
from .sealed import unsealed


@dataclass(frozen=True)
class GroupRecipe:
    """One group of the job as the script made it: its c10d name, members and backends."""

    name: str
    ranks: tuple[int, ...]
    backend: str
    timeout_s: float


@dataclass(frozen=True)
class WorldRecipe:
    """Everything a survivor replays: the script's groups, the control group's name, and c10d's
    group counter right after attach (what a spare's counter reads after its own attach)."""

    groups: tuple[GroupRecipe, ...]
    control_name: str
    count_after_attach: int


def replayable(name: str) -> bool:
    """A group a spare's script makes under the same name: by ``new_group``'s counter, or by
    ``accelpact.comm.make_group`` (label and generation)."""
    return name.isdigit() or parse_group_name(name) is not None


def record(control_group: dist.ProcessGroup, timeout_of) -> WorldRecipe:
    """The recipe of this rank's world, taken at attach (right after the control plane is built),
    in creation order (c10d's registration order): members build a group together, so every
    rank must replay its groups in the order the script made them. A group under any other name
    (hashed, split) would not be made again by the spare: refused here, before training starts."""
    groups = []
    for name, ranks, backend in _c10d.member_groups():
        if name == control_group.group_name:
            continue
        if not replayable(name):
            raise ConfigError(f"group {name!r} was not made by new_group's counter or accelpact.comm.make_group: "
                              "a spare could not make it again under the same name, so spares cannot be used "
                              "with it")
        groups.append(GroupRecipe(name, tuple(ranks), backend, timeout_of(name)))
    if not control_group.group_name.isdigit():
        raise ConfigError(f"the control group {control_group.group_name!r} has no counter name: cannot be rebuilt")
    return WorldRecipe(tuple(groups), control_group.group_name, _c10d.group_count())


def translated(recipe: WorldRecipe, renumber: dict[int, int]) -> WorldRecipe:
    """The recipe of a smaller world (a shrink): each group keeps its name and its members that
    stay, renumbered (a replicate group of one rank is still built: the mesh has that dimension).
    A group none of whose members stays is this rank's no longer, and would not be recorded."""
    groups = tuple(GroupRecipe(g.name, tuple(renumber[r] for r in g.ranks if r in renumber), g.backend, g.timeout_s)
                   for g in recipe.groups)
    empty = [g.name for g in groups if not g.ranks]
    if empty:
        raise ConfigError(f"groups {empty} keep no member after the shrink, yet this rank stays: its recipe is wrong")
    return WorldRecipe(groups, recipe.control_name, recipe.count_after_attach)


def groups_made_after_attach(recipe: WorldRecipe) -> str:
    """Why a spare cannot join, if the script made counter-named groups after attach (empty if
    not). A spare's script makes them after its own attach, when it has joined: no survivor
    would meet that `new_group`, and the spare would hang in it until its timeout. AccelPact's
    own groups after attach are named by label (`make_group`) or restore the counter."""
    made = _c10d.group_count() - recipe.count_after_attach
    if made <= 0:
        return ""
    return (f"the script made {made} group(s) by new_group or init_device_mesh after attach (c10d's counter reads "
            f"{_c10d.group_count()}, {recipe.count_after_attach} right after attach): a spare's script would make "
            "them after it joined, where no survivor meets it; make every group before attach")


def init_world(job_store: dist.Store, world: int, *, position: int, world_size: int, backend: str,
               timeout: datetime.timedelta, connect_timeout: datetime.timedelta | None = None) -> None:
    """(Re-)initialise the default group of world `world` (destroying the old one and every group
    with it when there is one). `connect_timeout` bounds the wait for every member to connect,
    after which the group keeps `timeout` (the job's, 30 min by default under spares): a survivor
    must not wait that long for a claimed spare that died before it connected."""
    if dist.is_initialized():
        dist.destroy_process_group()
    store = dist.PrefixStore(keys.world_prefix(world), unsealed(job_store))  # c10d's rendezvous: its own values
    dist.init_process_group(backend, store=store, rank=position, world_size=world_size,
                            timeout=connect_timeout or timeout)
    if connect_timeout is not None:
        _c10d.set_group_timeout(_c10d.default_group(), timeout)


def replay(recipe: WorldRecipe, *, build_timeout_s: float) -> dict[str, dist.ProcessGroup]:
    """Re-create the recorded groups under their names (c10d's counter set before each), with a
    build timeout long enough for a spare that is still building its model; each group then gets
    its recorded timeout back. Leaves the counter where the control plane's construction expects
    it: at the control group's name."""
    built: dict[str, dist.ProcessGroup] = {}
    for g in recipe.groups:
        # the name is in use again, on the new world's store prefix: failures naming it are not
        # "retired", and its generation may be built again
        forget_retired([g.name])
        timeout = datetime.timedelta(seconds=max(build_timeout_s, g.timeout_s))
        if g.name.isdigit():
            _c10d.set_group_count(int(g.name))
            pg = dist.new_group(ranks=list(g.ranks), backend=g.backend or None, timeout=timeout)
        else:
            label, generation = parse_group_name(g.name)
            pg = make_group(g.ranks, label=label, generation=generation, timeout=timeout, backend=g.backend or "gloo")
        if pg.group_name != g.name:
            raise ConfigError(f"replayed group got name {pg.group_name!r}, expected {g.name!r}")
        _c10d.set_group_timeout(pg, datetime.timedelta(seconds=g.timeout_s))
        built[g.name] = pg
    _c10d.set_group_count(int(recipe.control_name))
    return built


def by_label(recipe_names: dict[str, str], built: dict[str, dist.ProcessGroup]) -> dict[str, dist.ProcessGroup]:
    """label -> rebuilt group, from label -> the name the script gave that group."""
    return {label: built[name] for label, name in recipe_names.items()}


def finish(recipe: WorldRecipe) -> None:
    """After the control plane is rebuilt: the counter reads what it read after attach."""
    _c10d.set_group_count(recipe.count_after_attach)


def same_groups(a: Sequence[tuple[str, tuple[int, ...]]], b: Sequence[tuple[str, tuple[int, ...]]]) -> bool:
    return sorted(a) == sorted(b)
