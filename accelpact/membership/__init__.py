"""Membership change: a lost rank's position is taken over by a hot spare (issue 15).

One module per concern, as for the recovery protocol: `decide` (pure: who is lost, who takes
over, where the state comes from), `pool` (the spares' side of the store), `register` (presence
and the one membership decision per world, in the store), `world` (re-initialise the default
group and replay the job's groups under their original names), `transfer` (a lost shard's state
from a live replica peer, digest-verified), `small_state` (the per-rank state that lives only on
one rank, replicated off it at every boundary).
"""
