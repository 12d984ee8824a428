"""A rank function for tests/test_gpu_path.py: two runtimes, one after the other, in one process.

Every runtime numbers its generations from 0, so without a per-attach scope the second runtime's
first replacement would take the first one's identity and store prefix (found by the device script's
CPU dry run, which runs a reference, a Preserve and a Rewind job in one process)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def reattach_world(rank: int, world_size: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import accelpact
    from accelpact.comm import group_identity

    out: dict = {"actions": [], "names": []}
    for _ in range(2):
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 2), process_group=dist.new_group(list(range(world_size))))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        config = accelpact.Config(data_timeout_s=1.0, control_timeout_s=6.0)
        rt = accelpact.attach(model, optimizer, config=config, faults="skip@2:committed:1")
        for _ in range(3):
            with rt.update():
                model(torch.ones(3, 4)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        out["actions"] += [record.action.value for record in rt.history]
        out["names"] += [group_identity(pg) for pg in rt.groups.values()]
        rt.close()
    return out
