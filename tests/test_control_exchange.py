"""The agreement's exchange: every rank gets every rank's message in rank order, by one round of
direct sends up to `DIRECT_MAX_WORLD` ranks and along gloo's ring above; a missing peer ends it at
the control plane's timeout, never at the one the group was built with."""

from __future__ import annotations

import pytest

from accelpact.testing.spawn import run_world


def _both_ways(rank: int, world_size: int) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    from accelpact.control.exchange import direct_exchange, ring_exchange

    timeout = datetime.timedelta(seconds=20)
    mine = torch.arange(5, dtype=torch.int64) + 100 * rank
    out = {}
    for name, fn in (("direct", direct_exchange), ("ring", ring_exchange)):
        got = fn(dist.group.WORLD, mine, rank=rank, world_size=world_size, tag=7, timeout=timeout)
        out[name] = [t.tolist() for t in got]
    return out


@pytest.mark.timeout(60)
def test_direct_sends_and_the_ring_give_every_rank_every_message_in_rank_order():
    expected = [[100 * r + i for i in range(5)] for r in range(3)]
    for out in run_world(_both_ways, 3, timeout_s=45):
        assert out["direct"] == expected and out["ring"] == expected, out


def _gather_without_all_gather(rank: int, world_size: int, direct_max: int) -> dict:
    import torch.distributed as dist

    from accelpact.control import ControlPlane, exchange

    exchange.DIRECT_MAX_WORLD = direct_max
    control = ControlPlane(timeout_s=10.0, attempt=0)
    ring_calls = []
    real = dist.all_gather

    def counted(*args, **kwargs):
        ring_calls.append(1)
        return real(*args, **kwargs)

    dist.all_gather = counted
    try:
        got = control.gather({"rank": rank, "note": "x" * rank})
    finally:
        dist.all_gather = real
    control.close()
    return {"got": got, "ring_calls": len(ring_calls)}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("direct_max,ring_calls", [(64, 0), (0, 1)])
def test_the_agreement_uses_direct_sends_up_to_the_limit_and_the_ring_above(direct_max, ring_calls):
    for out in run_world(_gather_without_all_gather, 3, direct_max, timeout_s=60):
        assert out["got"] == [{"rank": r, "note": "x" * r} for r in range(3)], out
        assert out["ring_calls"] == ring_calls, out


def _peer_never_comes(rank: int, world_size: int) -> dict:
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from accelpact.control.exchange import direct_exchange

    # built with 30 s, as the control group is built with its connect timeout: the exchange
    # must end at the timeout it is given
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=30))
    if rank == 0:
        time.sleep(3.0)  # never exchanges; stays until its peer gave up
        return {}
    t = time.monotonic()
    try:
        direct_exchange(group, torch.zeros(8, dtype=torch.uint8), rank=rank, world_size=world_size, tag=1,
                        timeout=datetime.timedelta(seconds=0.5))
    except Exception as exc:  # gloo's RuntimeError, or ExchangeTimeout
        return {"raised": f"{type(exc).__name__}: {exc}", "after_s": time.monotonic() - t}
    return {"raised": None}


@pytest.mark.timeout(60)
def test_a_peer_that_never_sends_ends_the_exchange_at_its_timeout():
    _, late = run_world(_peer_never_comes, 2, timeout_s=45)
    assert late["raised"] is not None and "Timed out" in late["raised"], late
    assert late["after_s"] < 2.5, late  # 0.5 s asked; gloo's own default would be the group's 30 s
