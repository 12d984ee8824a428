"""Real network faults for AccelPact: emulated nodes in network namespaces, a real multi-node
torchrun job across them, and a nemesis that cuts and restores node links mid-training.

`topology` builds and always tears down the fabric, `job` launches the agents, `nemesis` plans
(pure, seeded) and performs the cuts, `worker` wraps the demo trainer with timing marks, `analysis`
turns the records into one row per cut and the share recovered in memory, `qualified` picks the
envelope the workers obey (a qualified file, as the README tells users), and `campaign` runs
bounded campaigns (`make chaos`).
`nodeloss` takes a whole node away for good (agent and workers) while a spare node waits
(`make chaos-nodeloss`).
"""

from .analysis import (
    CutResult,
    InMemoryShare,
    NodeLossResult,
    ScenarioResult,
    analyse,
    analyse_node_loss,
    format_share,
    format_table,
    in_memory_share,
    load_run,
)
from .job import Job, JobSpec
from .nemesis import Cut, CutMethod, Nemesis, cut_commands, parse_schedule, plan_random
from .nodeloss import LossMethod, NodeLoss, Reaper, parse_loss
from .qualified import EnvelopePlan, EnvelopeUnavailable, resolve_envelope
from .topology import ChaosUnavailable, Topology, TopologyError, TopologySpec, emulated_nodes, preflight

__all__ = [
    "ChaosUnavailable",
    "Cut",
    "CutMethod",
    "CutResult",
    "EnvelopePlan",
    "EnvelopeUnavailable",
    "InMemoryShare",
    "Job",
    "JobSpec",
    "LossMethod",
    "Nemesis",
    "NodeLoss",
    "NodeLossResult",
    "Reaper",
    "ScenarioResult",
    "Topology",
    "TopologyError",
    "TopologySpec",
    "analyse",
    "analyse_node_loss",
    "cut_commands",
    "emulated_nodes",
    "format_share",
    "format_table",
    "in_memory_share",
    "load_run",
    "parse_loss",
    "parse_schedule",
    "plan_random",
    "preflight",
    "resolve_envelope",
]
