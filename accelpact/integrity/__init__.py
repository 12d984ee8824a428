"""Replica integrity: whether the holders of one shard still hold the same bytes (silent data
corruption), decided purely in `agreement`; the effects (digests, gathers, repair) are
`accelpact.runtime.digests`."""

from .agreement import DigestVerdict, HolderDigest, ShardVerdict, decide_agreement

__all__ = ["DigestVerdict", "HolderDigest", "ShardVerdict", "decide_agreement"]
