"""What signing a membership value costs (`membership.sealed`): seal and open, in µs per value,
for a small state (RNG + cursor, the largest value a rank writes per boundary) and a vote.

    python bench/sealing.py [--n 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import timeit

import torch

from accelpact.control.auth import Sealer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=2000, help="repetitions per figure")
    n = ap.parse_args().n
    sealer = Sealer(b"k" * 32, "membership/run/attempt0")
    small = (7).to_bytes(8, "little") + pickle.dumps({"rng": torch.get_rng_state(), "cursor": {"i": 3}}, protocol=5)
    vote = json.dumps({"ok": True, "reason": ""}).encode()
    print(f"load {os.getloadavg()[0]:.2f} (1-minute average)")
    key = "membership/world0/small/1/1"
    for name, data in ((f"small state ({len(small)} B)", small), (f"vote ({len(vote)} B)", vote)):
        sealed = sealer.seal_bytes(data, key)
        seal_us = timeit.timeit(lambda d=data: sealer.seal_bytes(d, key), number=n) / n * 1e6
        open_us = timeit.timeit(lambda s=sealed: sealer.open_bytes(s, key), number=n) / n * 1e6
        print(f"{name}: seal {seal_us:.1f} µs, open {open_us:.1f} µs, +{len(sealed) - len(data)} B")


if __name__ == "__main__":
    main()
