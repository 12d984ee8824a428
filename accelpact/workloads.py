"""Tiny, deterministic training workloads for tests, benchmarks and the demo.

Everything here is seeded and independent of the global RNG, so that two runs with the same seed
and data produce bit-identical parameters and optimizer state: the yardstick by which an
in-memory recovery is judged (it must change nothing but the communicators).

The HSDP layout is the one the recovery targets: ``nodes`` × ``local`` ranks, sharding inside a
node (shard groups) and replicating across nodes (replicate groups). For world 4 = 2 × 2 the
shard groups are {0,1},{2,3} and the replicate groups {0,2},{1,3}.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from accelpact.comm import make_group

__all__ = [
    "FRAMEWORKS",
    "Block",
    "HSDPGroups",
    "HSDPLayout",
    "SyntheticTokens",
    "TinyDecoder",
    "build_hsdp_job",
    "make_adam",
    "next_token_loss",
    "seed_everything",
    "stochastic_update",
    "train_step",
    "wrap_ddp",
    "wrap_fsdp1",
    "wrap_fsdp2",
]

DEFAULT_GROUP_TIMEOUT = datetime.timedelta(seconds=30)


# --------------------------------------------------------------------------------------------
# model


class Block(nn.Module):
    """Pre-norm causal self-attention + MLP block: the unit that FSDP wraps."""

    def __init__(self, dim: int, n_heads: int, ffn_mult: int = 4) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim {dim} is not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, ffn_mult * dim)
        self.down = nn.Linear(ffn_mult * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.n_heads, dim // self.n_heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyDecoder(nn.Module):
    """A small causal language model whose ``layers`` (an ``nn.ModuleList`` of ``Block``) FSDP wraps.

    Initialisation draws from a private generator seeded by ``seed``, in parameter order, so the
    same arguments always give the same weights whatever the global RNG state.
    """

    def __init__(
        self,
        vocab: int = 64,
        dim: int = 32,
        n_layers: int = 4,
        *,
        n_heads: int = 2,
        max_seq: int = 32,
        ffn_mult: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self.max_seq = max_seq
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_seq, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads, ffn_mult) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Deterministic init: N(0, 0.02) matrices, unit LayerNorm weights, zero biases."""
        generator = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif "norm" in name:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting token t+1 from tokens ≤ t."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    """One update: forward, backward (the data-plane collectives), optimizer step; returns the loss.

    The optimizer boundary after ``step()`` is the committed boundary at which recovery acts.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = next_token_loss(model, tokens)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


# --------------------------------------------------------------------------------------------
# data


class SyntheticTokens:
    """Deterministic token batches addressed by (seed, cursor, shard), with a resumable cursor.

    A batch depends only on those three numbers, so restoring ``state_dict()`` resumes the exact
    stream: the κ of the recovery state model.
    """

    def __init__(self, vocab: int, seq_len: int, batch_size: int, *, seed: int = 0, shard: int = 0) -> None:
        self.vocab = vocab
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.shard = shard
        self.cursor = 0

    def batch_at(self, cursor: int) -> torch.Tensor:
        """The batch number ``cursor`` of this shard, without moving the cursor."""
        generator = torch.Generator().manual_seed(_mix(self.seed, cursor, self.shard))
        return torch.randint(0, self.vocab, (self.batch_size, self.seq_len + 1), generator=generator)

    def next_batch(self) -> torch.Tensor:
        batch = self.batch_at(self.cursor)
        self.cursor += 1
        return batch

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.next_batch()

    def reshard(self, index: int, count: int) -> None:
        """The partition of a smaller world (`Config.on_loss="shrink"`): this rank reads stream
        `index` of `count` from the same cursor on. No batch is read twice: the streams of the
        staying ranks were read up to this cursor only, by whoever held them."""
        if not 0 <= index < count:
            raise ValueError(f"stream {index} of {count} does not exist")
        self.shard = index

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "shard": self.shard, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if (state["seed"], state["shard"]) != (self.seed, self.shard):
            raise ValueError(f"state of stream (seed {state['seed']}, shard {state['shard']}) loaded into "
                             f"stream (seed {self.seed}, shard {self.shard})")
        self.cursor = int(state["cursor"])


def _mix(seed: int, cursor: int, shard: int) -> int:
    return (seed * 1_000_003 + cursor * 7_919 + shard * 104_729) % (2**63 - 1)


# --------------------------------------------------------------------------------------------
# layout and groups


@dataclass(frozen=True)
class HSDPLayout:
    """``nodes`` × ``local`` ranks; rank = node · local + local_rank.

    Shard groups are the ranks of one node; replicate groups are the ranks with the same local
    rank on every node. The 2-D mesh is ``mesh()[node][local_rank]`` with dims
    ("replicate", "shard").
    """

    nodes: int = 2
    local: int = 2

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.local < 1:
            raise ValueError(f"layout needs at least one node and one local rank, got {self}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.local

    def node_of(self, rank: int) -> int:
        return self._check(rank) // self.local

    def local_rank_of(self, rank: int) -> int:
        return self._check(rank) % self.local

    def shard_ranks(self, rank: int) -> list[int]:
        """Ranks that shard parameters with ``rank`` (its node)."""
        first = self.node_of(rank) * self.local
        return list(range(first, first + self.local))

    def replicate_ranks(self, rank: int) -> list[int]:
        """Ranks that hold the same shard as ``rank`` (same local rank on every node)."""
        return [node * self.local + self.local_rank_of(rank) for node in range(self.nodes)]

    def mesh(self) -> torch.Tensor:
        return torch.arange(self.world_size, dtype=torch.int).view(self.nodes, self.local)

    def build_groups(
        self, *, timeout: datetime.timedelta = DEFAULT_GROUP_TIMEOUT, generation: int = 0
    ) -> HSDPGroups:
        """Build this rank's shard and replicate groups (every rank calls; explicit timeout)."""
        rank = dist.get_rank()
        if dist.get_world_size() != self.world_size:
            raise ValueError(f"layout {self} needs world size {self.world_size}, got {dist.get_world_size()}")
        shard = make_group(self.shard_ranks(rank), label="shard", generation=generation, timeout=timeout)
        replicate = make_group(
            self.replicate_ranks(rank), label="replicate", generation=generation, timeout=timeout
        )
        return HSDPGroups(layout=self, shard=shard, replicate=replicate)

    def _check(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside layout of {self.world_size} ranks")
        return rank


@dataclass
class HSDPGroups:
    """This rank's data-plane groups for an ``HSDPLayout``."""

    layout: HSDPLayout
    shard: dist.ProcessGroup
    replicate: dist.ProcessGroup

    def device_mesh(self, device_type: str = "cpu") -> Any:
        """A 2-D DeviceMesh ("replicate", "shard") over exactly these groups (no new groups)."""
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(
            [self.replicate, self.shard],
            device_type,
            mesh=self.layout.mesh(),
            mesh_dim_names=("replicate", "shard"),
        )


# --------------------------------------------------------------------------------------------
# wrappers


def _groups_or_build(layout: HSDPLayout, groups: HSDPGroups | None, timeout: datetime.timedelta) -> HSDPGroups:
    return groups if groups is not None else layout.build_groups(timeout=timeout)


def wrap_fsdp1(
    model: TinyDecoder,
    layout: HSDPLayout,
    use_orig_params: bool = False,
    *,
    groups: HSDPGroups | None = None,
    use_mesh: bool = False,
    timeout: datetime.timedelta = DEFAULT_GROUP_TIMEOUT,
) -> nn.Module:
    """FSDP1 ``HYBRID_SHARD``: one FSDP unit per block plus the root, on CPU.

    Groups are passed explicitly, as ``(shard, replicate)`` or, with ``use_mesh``, as a 2-D
    DeviceMesh: with ``process_group=None`` FSDP1 on CPU silently falls back to NO_SHARD.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    groups = _groups_or_build(layout, groups, timeout)
    placement: dict[str, Any] = (
        {"device_mesh": groups.device_mesh()} if use_mesh else {"process_group": (groups.shard, groups.replicate)}
    )
    return FullyShardedDataParallel(
        model,
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        device_id=torch.device("cpu"),
        use_orig_params=use_orig_params,
        **placement,
    )


def wrap_fsdp2(
    model: TinyDecoder,
    layout: HSDPLayout,
    *,
    groups: HSDPGroups | None = None,
    timeout: datetime.timedelta = DEFAULT_GROUP_TIMEOUT,
) -> nn.Module:
    """FSDP2 ``fully_shard`` HSDP on a 2-D mesh ("replicate", "shard"): one call per block + root."""
    return _fully_shard_blocks(model, _groups_or_build(layout, groups, timeout).device_mesh())


def wrap_fsdp2_full(model: TinyDecoder, *, timeout: datetime.timedelta = DEFAULT_GROUP_TIMEOUT,
                    generation: int = 0) -> nn.Module:
    """FSDP2 ``fully_shard`` over a 1-D mesh of every rank (a "shard" group of the whole world)."""
    from torch.distributed.device_mesh import DeviceMesh

    world = dist.get_world_size()
    shard = make_group(list(range(world)), label="shard", generation=generation, timeout=timeout)
    return _fully_shard_blocks(model, DeviceMesh.from_group(shard, "cpu", mesh=torch.arange(world, dtype=torch.int),
                                                            mesh_dim_names=("shard",)))


def _fully_shard_blocks(model: TinyDecoder, mesh: Any) -> nn.Module:
    """One ``fully_shard`` per block, then the root, on `mesh`."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def wrap_fsdp1_full(model: TinyDecoder, *, timeout: datetime.timedelta = DEFAULT_GROUP_TIMEOUT,
                    generation: int = 0) -> nn.Module:
    """FSDP1 ``FULL_SHARD`` over a "shard" group of the whole world: one unit per block plus the root."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    shard = make_group(list(range(dist.get_world_size())), label="shard", generation=generation, timeout=timeout)
    return FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.FULL_SHARD, process_group=shard,
                                    auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))


def wrap_ddp(
    model: nn.Module,
    layout: HSDPLayout,
    *,
    groups: HSDPGroups | None = None,
    timeout: datetime.timedelta = DEFAULT_GROUP_TIMEOUT,
) -> nn.Module:
    """DDP over this rank's replicate group: each node-local rank is an independent replica pair."""
    from torch.nn.parallel import DistributedDataParallel

    groups = _groups_or_build(layout, groups, timeout)
    return DistributedDataParallel(model, process_group=groups.replicate)


def make_adam(model: nn.Module, lr: float = 1e-2) -> torch.optim.Optimizer:
    """Adam with a fixed implementation (no foreach/fused switch between runs)."""
    return torch.optim.Adam(model.parameters(), lr=lr, foreach=False)




# --------------------------------------------------------------------------------------------
# one job: the shape the demo, the drills and the benches share

#: "fsdp2-full" / "fsdp1-full": FSDP2 `fully_shard` over one mesh dimension of every rank, FSDP1
#: FULL_SHARD over every rank: each shard exists once (no replica peer can send it to a spare;
#: `Config.replicate="neighbour"` can).
FRAMEWORKS = ("fsdp2", "fsdp1", "fsdp1-orig", "ddp", "fsdp2-full", "fsdp1-full")


def build_hsdp_job(
    framework: str,
    *,
    layers: int = 4,
    dim: int = 32,
    seed: int = 0,
    local: int = 2,
    seq_len: int = 16,
    batch_size: int = 4,
    generation: int = 0,
    setup_timeout: datetime.timedelta = DEFAULT_GROUP_TIMEOUT,
) -> tuple[nn.Module, torch.optim.Optimizer, SyntheticTokens]:
    """This rank's wrapped decoder, optimizer and data shard for an HSDP job of the whole world.

    Groups are built with ``setup_timeout``: set-up collectives (DDP's parameter broadcast, FSDP's
    init) wait for slow starters; ``accelpact.attach`` later narrows it to the data-plane timeout.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; expected one of {', '.join(FRAMEWORKS)}")
    world = dist.get_world_size()
    if world % local:
        raise ValueError(f"world size {world} is not a multiple of {local} ranks per node")
    model = TinyDecoder(dim=dim, n_layers=layers, seed=seed)
    data = SyntheticTokens(vocab=model.vocab, seq_len=seq_len, batch_size=batch_size, seed=seed,
                           shard=dist.get_rank())
    if framework in ("fsdp2-full", "fsdp1-full"):
        wrap = wrap_fsdp2_full if framework == "fsdp2-full" else wrap_fsdp1_full
        wrapped = wrap(model, timeout=setup_timeout, generation=generation)
        return wrapped, make_adam(wrapped), data
    layout = HSDPLayout(nodes=world // local, local=local)
    groups = layout.build_groups(timeout=setup_timeout, generation=generation)
    if framework == "fsdp2":
        wrapped = wrap_fsdp2(model, layout, groups=groups)
    elif framework in ("fsdp1", "fsdp1-orig"):
        wrapped = wrap_fsdp1(model, layout, use_orig_params=framework == "fsdp1-orig", groups=groups)
    else:
        wrapped = wrap_ddp(model, layout, groups=groups)
    return wrapped, make_adam(wrapped), data


def seed_everything(seed: int) -> None:
    """Seed every RNG kind a trainer consumes (torch CPU, NumPy, Python)."""
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def stochastic_update(model: nn.Module, optimizer: torch.optim.Optimizer, data: SyntheticTokens) -> float:
    """One update of a trainer that also consumes randomness (dropout, sampling) every step: it
    advances every RNG kind, so a replayed or skipped update shows in a bitwise comparison."""
    import random

    import numpy as np

    tokens = data.next_batch()
    torch.rand(1)
    np.random.rand()
    random.random()
    loss = next_token_loss(model, tokens)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def add_running_stat(model: nn.Module, framework: str) -> None:
    """Give `model` a buffer that every forward writes from the rank's own batch, as BatchNorm's
    running statistics are (FSDP never syncs them, so each rank's differs): what a Rewind must put
    back and what a spare must take from the lost rank itself, not from a replica peer."""
    if framework != "fsdp2":
        raise ValueError(f"running_stat is built for fsdp2 only, not {framework!r}")
    model.register_buffer("running_stat", torch.zeros(()))

    def update(module, args, output):
        with torch.no_grad():
            module._buffers["running_stat"].mul_(0.5).add_(output.detach().float().mean())

    model.register_forward_hook(update)
