"""One process of a drill launched with hot spares (`accelpact.testing.spares.launch_with_spares`).

The fault campaign's spares profile runs `drills.run_drill` the way a user's script runs under
torchrun with `ACCELPACT_SPARES=S`: `accelpact.init_process_group` makes the last S processes
wait as spares; an activated spare returns from it on the lost rank's position, builds the same
job and joins in `attach`. Each process that finishes writes its summary to
`<out>/result-<launch rank>.json` (a killed process writes nothing; an unneeded spare exits 0
from `init_process_group` with nothing to report).

    python -m accelpact.testing.spare_drill --drill '<Drill as JSON>' --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path

from ..errors import EXIT_REJECTED


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accelpact.testing.spare_drill")
    p.add_argument("--drill", required=True, help="the Drill's fields as JSON")
    p.add_argument("--out", required=True, type=Path, help="result-<launch rank>.json goes here")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import accelpact
    from accelpact.testing.drills import Drill, run_drill

    torch.set_num_threads(1)
    drill = Drill(**json.loads(args.drill))
    launch_rank = int(os.environ["RANK"])
    accelpact.init_process_group("gloo", timeout=datetime.timedelta(seconds=drill.control_timeout_s * 2))
    position, world = dist.get_rank(), dist.get_world_size()
    out = run_drill(position, world, drill)
    out.update(launch_rank=launch_rank, position=position)
    path = args.out / f"result-{launch_rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    tmp.rename(path)
    if out["rejected"] is not None:
        # the world lost a rank it could not replace: a supervisor restarts the whole job (L2)
        sys.stdout.flush()
        os._exit(EXIT_REJECTED)
    dist.destroy_process_group()
    return 0


def drill_json(drill) -> str:
    return json.dumps(dataclasses.asdict(drill))


if __name__ == "__main__":
    sys.exit(main())
