"""The one place that touches torchelastic's private store keys (torch 2.13), pinned by
`tests/test_launch_elastic.py`.

Under torchrun every agent waits at the end of the job in an *exit barrier* until all agents of
the rendezvous arrive (300 s, not configurable from the command line). An agent whose worker was
lost (SIGKILL, `--max-restarts=0`) never arrives, so after a replacement every surviving agent
would wait the full 300 s before the job ends. The last position to finish checks in once for
each agent that will never come: the barrier is a counter in the rendezvous store, keyed by
run id and rendezvous round (`dynamic_rendezvous._wrap_store`, `utils.store.barrier`).

Workers are not told where the rendezvous store is (their MASTER_PORT is a store of its own,
hosted by the agent of rank 0), so the launch says it: ACCELPACT_RDZV_ENDPOINT, the value given
to ``--rdzv-endpoint``, read as torchrun reads it (``host[:port]``, port 29400 when none is given).
`accelpact.init_process_group` checks it where spares or shrink begin (`rendezvous_endpoint`):
it is used only at the job's end, where a bad value would cost every surviving agent the full
barrier."""

from __future__ import annotations

import datetime
import logging
import os

import torch.distributed as dist

from .errors import ConfigError

log = logging.getLogger("accelpact.launch")

#: torch/distributed/elastic/agent/server/api.py _TERMINAL_STATE_SYNC_ID
TERMINAL_STATE = "torchelastic/agent/terminal_state"
#: torch/distributed/elastic/utils/store.py _NUM_MEMBERS and _LAST_MEMBER_CHECKIN
NUM_MEMBERS, LAST_MEMBER = "/num_members", "/last_member"
#: torch/distributed/elastic/agent/server/api.py: each agent writes its role info per round
ROLE_INFO = "torchelastic/role_info/"
MAX_ROUNDS = 64
ENV_ENDPOINT = "ACCELPACT_RDZV_ENDPOINT"
#: torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py DEFAULT_PORT: the port of an
#: endpoint given as a host alone
DEFAULT_PORT = 29400


def rendezvous_endpoint(env=None) -> tuple[str, int] | None:
    """(host, port) of ACCELPACT_RDZV_ENDPOINT, parsed as torchrun parses ``--rdzv-endpoint``
    (None when unset or empty, as an optional setting of `Config`). A value torchrun would refuse,
    or port 0 (which a client cannot reach), is a `ConfigError` naming the variable."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    env = os.environ if env is None else env
    raw = env.get(ENV_ENDPOINT)
    if raw is None or not raw.strip():
        return None
    try:
        host, port = parse_rendezvous_endpoint(raw, default_port=DEFAULT_PORT)
    except ValueError as exc:
        raise ConfigError(f"{ENV_ENDPOINT}={raw!r}: {exc} (the value given to torchrun's --rdzv-endpoint, "
                          f"host[:port])") from None
    if port == 0:
        raise ConfigError(f"{ENV_ENDPOINT}={raw!r}: port 0 is no endpoint a worker can reach; give the port the "
                          "rendezvous store listens on")
    return host, port


def rendezvous_store(env=None) -> dist.Store | None:
    """A client of the rendezvous store named by ACCELPACT_RDZV_ENDPOINT (None when not given)."""
    endpoint = rendezvous_endpoint(env)
    if endpoint is None:
        return None
    host, port = endpoint
    return dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=10))


def rendezvous_prefix(run_id: str, round_: int) -> str:
    return f"torch.rendezvous.{run_id}.{round_}/"


def current_round(client: dist.Store, run_id: str) -> int | None:
    """The newest rendezvous round whose agents wrote their role info (None: not under agents)."""
    found = None
    for r in range(MAX_ROUNDS):
        if client.check([rendezvous_prefix(run_id, r) + ROLE_INFO + "0"]):
            found = r
        elif found is not None:
            break
    return found


def check_in_for_lost_agents(lost: int, agents: int, env=None, client: dist.Store | None = None) -> bool:
    """Arrive at the exit barrier once for each of `lost` agents (of `agents` in all); True when
    it was found and done."""
    env = os.environ if env is None else env
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if lost <= 0 or not run_id:
        return False
    client = client if client is not None else rendezvous_store(env)
    if client is None:
        log.warning("%d agent(s) were lost: without %s the surviving torchrun agents wait out their exit "
                    "barrier (300 s) before the job ends", lost, ENV_ENDPOINT)
        return False
    round_ = current_round(client, run_id)
    if round_ is None:
        return False
    key = rendezvous_prefix(run_id, round_) + TERMINAL_STATE
    for _ in range(lost):
        if client.add(key + NUM_MEMBERS, 1) == agents:
            client.set(key + LAST_MEMBER, "<val_ignored>")
    log.info("checked in at torchelastic's exit barrier for %d lost agent(s) (round %d)", lost, round_)
    return True
