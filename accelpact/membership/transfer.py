"""A lost shard's state from a live replica peer to the spare, verified by digest.

What moves: the parameters' local tensors (a DTensor's local shard, an FSDP1 flat parameter,
a DDP parameter), the module buffers, and every optimizer state tensor, in one fixed order both
sides derive from their identical wrappers. The sender packs them into one byte buffer and posts
the SHA-256 of exactly those bytes; the spare receives in one message, checks it against that
digest, and only then copies into its tensors in place. Optimizer state is created lazily by
torch: the spare materialises it from the sender's manifest first.

What holders must agree on is less: the parameters and the optimizer state (`shared_digest`).
Buffers are each replica's own: BatchNorm's running statistics, say, are updated from the rank's
own batch (DDP broadcasts rank 0's at the start of each forward, FSDP never), so healthy replicas
differ in them, and a check over every byte rejected any such model at its first look (found by
review). Every holder posts the shared digest of its copy, and the spare checks the received
bytes' shared digest against all of them (two holders must agree where two survive)."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..control.auth import ForgedValue
from ..errors import AccelPactError
from . import keys

#: The slowest a shard may move, end to end, in bytes a second: gloo carries it, the spare hashes
#: it twice and copies it in. A transfer's bound grows by its bytes at this rate above the join
#: floor (`transfer_timeout_s`): under a fixed bound (the control group's, the survivors' 60 s
#: wait for the spare) a large enough shard could never make it (found by review).
SLOWEST_TRANSFER_BPS = 50e6
#: The slowest a holder may pack and hash, in bytes a second (1.09 GB/s measured here): before it
#: posts the digests the spare waits for, each holder copies its shard and hashes it twice, which
#: for tens of GB outlasts any fixed wait.
SLOWEST_HASH_BPS = 200e6
#: A shard's state per byte of its parameters that the spare estimates before any digest tells it
#: (Adam in fp32: the parameter and two moments); only the waits before the digests use it.
STATE_PER_PARAM_BYTE = 3


class TransferError(AccelPactError, RuntimeError):
    """The state received does not verify, or does not fit the spare's wrappers."""


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def entries(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """(name, local tensor) of everything that moves, in the order both sides agree on. Each is a
    view of the live storage. Taken outside autograd: a DTensor's `to_local()` there is a plain
    view, 25x cheaper than detaching the DTensor first (116 tensors: 0.1 ms against 2.5 ms), which
    matters because neighbour replication takes them after every optimizer step."""
    out: list[tuple[str, torch.Tensor]] = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            out.append((f"param:{name}", _local(p).detach()))
        for name, b in model.named_buffers():
            out.append((f"buffer:{name}", b.detach()))
        index = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                for key in sorted(state):
                    value = state[key]
                    if isinstance(value, torch.Tensor):
                        out.append((f"optim:{index}:{key}", _local(value).detach()))
                index += 1
    return out


def manifest(model: nn.Module, optimizer: torch.optim.Optimizer,
             moved: list[tuple[str, torch.Tensor]] | None = None) -> dict:
    """The sender's layout: what the spare must materialise before it can receive (`moved`:
    `entries(model, optimizer)` when the caller has them already)."""
    moved = entries(model, optimizer) if moved is None else moved
    tensors = [[name, list(t.shape), str(t.dtype).removeprefix("torch.")] for name, t in moved]
    scalars = {}
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if not isinstance(value, torch.Tensor):
                    scalars[f"{index}:{key}"] = value
            index += 1
    return {"tensors": tensors, "scalars": scalars}


def pack(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    parts = [t.contiguous().cpu().reshape(-1).view(torch.uint8) for _, t in entries(model, optimizer)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def digest(buf: torch.Tensor) -> str:
    return hashlib.sha256(buf.numpy()).hexdigest()  # hashes the buffer in place, no copy


def is_shared(name: str) -> bool:
    """Whether every replica of a shard holds the tensor `name` (an `entries` name) alike."""
    return not name.startswith("buffer:")


def shared_digest(buf: torch.Tensor, layout: dict) -> str:
    """The SHA-256 of the bytes of `buf` (packed as `layout` says) that every replica holds
    alike: its parameters and optimizer state, not its buffers. In place, no copy."""
    h = hashlib.sha256()
    raw, offset = buf.numpy(), 0
    for name, shape, dtype in layout["tensors"]:
        n = math.prod(shape) * getattr(torch, dtype).itemsize
        if is_shared(name):
            h.update(raw[offset:offset + n])
        offset += n
    if offset != buf.numel():
        raise TransferError(f"{buf.numel()} bytes, the layout accounts for {offset}")
    return h.hexdigest()


def tensor_words(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[str], list[int]]:
    """Every shared tensor's name and the first 64 bits of its SHA-256 (a signed int64): enough
    to name the tensors in which two copies differ (`accelpact.integrity`)."""
    names, words = [], []
    for name, t in entries(model, optimizer):
        if not is_shared(name):
            continue
        raw = t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        names.append(name)
        words.append(int.from_bytes(hashlib.sha256(raw).digest()[:8], "little", signed=True))
    return names, words


def state_device(key: str, param_device: torch.device, group: dict) -> torch.device:
    """Where torch keeps optimizer state `key` of a parameter on `param_device`: every tensor
    with the parameter, but `step` on the CPU unless the group is capturable or fused (torch's
    note "special device hosting for step", `torch/optim/adam.py` and `Optimizer.load_state_dict`)."""
    if key == "step" and not (group.get("capturable") or group.get("fused")):
        return torch.device("cpu")
    return param_device


def materialise(model: nn.Module, optimizer: torch.optim.Optimizer, layout: dict) -> None:
    """Create the optimizer state the sender has (same keys, shapes, dtypes, scalars), zeroed:
    torch creates it lazily at the first step, which the spare has not taken."""
    params = [(p, group) for group in optimizer.param_groups for p in group["params"]]
    for name, shape, dtype in layout["tensors"]:
        if not name.startswith("optim:"):
            continue
        _, index, key = name.split(":", 2)
        p, group = params[int(index)]
        like = p.detach()
        device = state_device(key, _local(like).device, group)
        value = torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
        if hasattr(like, "to_local") and value.dim() > 0:  # DTensor parameter: its state is a DTensor alike
            from torch.distributed.tensor import DTensor

            value = DTensor.from_local(value, like.device_mesh, like.placements, run_check=False,
                                       shape=like.shape, stride=like.stride())
        optimizer.state.setdefault(p, {})[key] = value
    for name, value in layout["scalars"].items():
        index, key = name.split(":", 1)
        optimizer.state.setdefault(params[int(index)][0], {})[key] = value


def unpack(model: nn.Module, optimizer: torch.optim.Optimizer, buf: torch.Tensor, layout: dict) -> None:
    mine = entries(model, optimizer)
    theirs = [(n, tuple(s), d) for n, s, d in layout["tensors"]]
    have = [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in mine]
    if have != theirs:
        diff = next((f"{a} vs {b}" for a, b in zip(have, theirs) if a != b), f"{len(have)} vs {len(theirs)} tensors")
        raise TransferError(f"the spare's wrappers differ from the sender's: {diff}")
    offset = 0
    with torch.no_grad():
        for _, t in mine:
            n = t.numel() * t.element_size()
            src = buf[offset:offset + n].clone().view(t.dtype).reshape(t.shape)  # aligned for the view
            t.copy_(src.to(t.device))
            offset += n
    if offset != buf.numel():
        raise TransferError(f"received {buf.numel()} bytes, the layout accounts for {offset}")


@dataclass
class TransferReport:
    lost: int
    source: int
    nbytes: int = 0
    digest: str = ""
    holders_agreeing: int = 0
    pack_s: float = 0.0
    transport_s: float = 0.0
    verify_s: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def packed(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[torch.Tensor, str, dict]:
    """A holder's own copy of its shard: its bytes, their digest and their layout."""
    buf = pack(model, optimizer)
    return buf, digest(buf), manifest(model, optimizer)


def post_held_digest(store: dist.Store, world: int, lost: int, position: int, value: str, buf: torch.Tensor,
                     layout: dict) -> None:
    """A holder posts the digest and layout of the copy `buf` it would send (its own state, or a
    neighbour copy: then the lost rank's own digest and layout, so that the spare checks the bytes
    against what the lost rank hashed, end to end), and the digest of the part every holder shares."""
    store.set(keys.digest(world, lost, position), json.dumps({
        "digest": value, "shared": shared_digest(buf, layout), "nbytes": int(buf.numel()), "layout": layout}))


def preparation_s(nbytes: int) -> float:
    """How long the holders may take to pack and hash `nbytes` (twice) before they post digests."""
    return 2 * nbytes / SLOWEST_HASH_BPS


def estimated_state_bytes(model: nn.Module) -> int:
    """The spare's guess of its position's state from its own (unfilled) model: this rank's local
    parameter bytes times `STATE_PER_PARAM_BYTE`."""
    return STATE_PER_PARAM_BYTE * sum(_local(p).numel() * p.element_size() for p in model.parameters())


def transfer_timeout_s(nbytes: int, floor_s: float) -> float:
    """How long moving `nbytes` may take: the join floor (what the other side may still be
    doing before it posts its half) and the bytes at the slowest rate allowed."""
    return floor_s + nbytes / SLOWEST_TRANSFER_BPS


def queued_before(source_of: Mapping[int, int], order: Sequence[int], lost: int) -> tuple[int, ...]:
    """The lost positions whose shard `lost`'s source sends before it (in `order`, the order the
    holders send in): the spare's receive waits for those transfers too."""
    source = source_of[lost]
    mine = order.index(lost)
    return tuple(p for p in order[:mine] if source_of.get(p) == source)


def _within(work: dist.Work, timeout_s: float | None) -> None:
    """Wait for a point-to-point operation: within `timeout_s`, or the group's own timeout (None).
    gloo bounds a send or recv by the timeout its group was built with; setting the group's
    timeout later (`_set_pg_timeout`) does not reach them (measured on torch 2.13: a group built
    with 1 s, set to 15 s, still timed out a recv after 1 s). So the bound is given to the wait."""
    if timeout_s is None:
        work.wait()
    else:
        work.wait(datetime.timedelta(seconds=timeout_s))


def send(buf: torch.Tensor, *, to: int, group: dist.ProcessGroup, timeout_s: float | None = None) -> float:
    """The size, then the packed bytes, within `timeout_s` each (`transfer_timeout_s`; None: the
    group's timeout, for a copy small enough to move within it)."""
    t = time.perf_counter()
    _within(dist.isend(torch.tensor([buf.numel()], dtype=torch.int64), dst=to, group=group), timeout_s)
    _within(dist.isend(buf, dst=to, group=group), timeout_s)
    return time.perf_counter() - t


def recv(source: int, *, group: dist.ProcessGroup, timeout_s: float | None = None) -> torch.Tensor:
    """What `send` sent from `source`: the size, then the packed bytes (`timeout_s` as `send`)."""
    size = torch.zeros(1, dtype=torch.int64)
    _within(dist.irecv(size, src=source, group=group), timeout_s)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    _within(dist.irecv(buf, src=source, group=group), timeout_s)
    return buf


def _posted_digests(store: dist.Store, world: int, lost: int, source: int, holders: tuple[int, ...],
                    ahead: tuple[int, ...], timeout_s: float) -> tuple[dict[int, dict], int]:
    """Every holder's posted digest of `lost`'s shard, and the bytes `source` sends before it
    (every holder posts all its digests before it sends any)."""
    queued = [keys.digest(world, p, source) for p in ahead]
    store.wait([keys.digest(world, lost, h) for h in holders] + queued, datetime.timedelta(seconds=timeout_s))
    posted = {h: json.loads(store.get(keys.digest(world, lost, h))) for h in holders}
    before = sum(int(json.loads(store.get(key))["nbytes"]) for key in queued)
    return posted, before


def receive(store: dist.Store, world: int, lost: int, source: int, holders: tuple[int, ...], *,
            model: nn.Module, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup,
            timeout_s: float, ahead: tuple[int, ...] = ()) -> TransferReport:
    """The spare: materialise, receive from `source`, verify against every holder's digest, copy
    in. `timeout_s`: the join floor; the receive gets as long as its bytes and those `source`
    sends first (`ahead`) take, announced in the store for the survivors (`await_taken_in`)."""
    report = TransferReport(lost=lost, source=source)
    # before the digests: the holders pack and hash every shard first; the survivors learn how long
    # that may take for a shard of this size (their wait extends by it), and so does the wait here
    guess = estimated_state_bytes(model) * (1 + len(ahead))
    early = transfer_timeout_s(guess, timeout_s) + preparation_s(guess)
    store.set(keys.receiving(world, lost), repr(early))
    posted, before = _posted_digests(store, world, lost, source, holders, ahead, timeout_s + preparation_s(guess))
    layout = posted[source]["layout"]
    materialise(model, optimizer, layout)
    bound = transfer_timeout_s(before + int(posted[source]["nbytes"]), timeout_s)
    store.set(keys.receiving(world, lost), repr(max(bound, early)))
    t = time.perf_counter()
    buf = recv(source, group=group, timeout_s=bound)
    report.transport_s = time.perf_counter() - t
    t = time.perf_counter()
    got = digest(buf)
    report.nbytes, report.digest = int(buf.numel()), got
    if got != posted[source]["digest"]:
        raise TransferError(f"state of rank {lost} from rank {source} does not verify: received digest "
                            f"{got[:12]}, the source posted {posted[source]['digest'][:12]}")
    shared = shared_digest(buf, layout)
    wrong = {h: d["shared"][:12] for h, d in posted.items() if d["shared"] != shared}
    if wrong:
        raise TransferError(f"the holders of rank {lost}'s shard disagree on its parameters or optimizer state: "
                            f"received {shared[:12]}, holders posted {wrong}")
    report.holders_agreeing = len(posted)
    unpack(model, optimizer, buf, layout)
    report.verify_s = time.perf_counter() - t
    return report


def announced_s(store: dist.Store, world: int, positions: Sequence[int]) -> float:
    """The longest receive the spares of `positions` announced (0 where none did yet)."""
    longest = 0.0
    for p in positions:
        key = keys.receiving(world, p)
        if store.check([key]):
            longest = max(longest, float(store.get(key)))
    return longest


def await_taken_in(store: dist.Store, world: int, positions: Sequence[int], floor_s: float) -> float:
    """(survivors) Wait until the spares of `positions` took in their state: `floor_s` for a spare
    to join, and as long again as the slowest one's receive may take, once it announced that.
    Returns the bound waited; TransferError naming it when the wait ran out."""
    wanted = [keys.taken_in(world, p) for p in positions]
    start, bound = time.monotonic(), floor_s
    while True:
        try:
            store.wait(wanted, datetime.timedelta(seconds=max(start + bound - time.monotonic(), 0.01)))
            for key in wanted:  # opened: a forged "taken in" must not end the wait (`membership.sealed`)
                try:
                    store.get(key)
                except ForgedValue as exc:
                    raise TransferError(f"a spare's word that it took in its state {exc}") from exc
            return bound
        except RuntimeError as exc:  # DistStoreError on timeout
            longer = floor_s + announced_s(store, world, positions)
            if longer <= bound:
                raise TransferError(f"within {bound:.0f}s ({floor_s:.0f}s to join, {bound - floor_s:.0f}s announced "
                                    f"for the transfer): {type(exc).__name__}: {exc}") from exc
            bound = longer
