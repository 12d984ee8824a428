"""Per-update cost of the boundary guard, measured in paired runs.

One 4-rank world trains the same model; updates alternate between guarded (`with rt.update()`)
and unguarded (the same code outside it), so drift and noise hit both arms alike. The guard's
cost is the difference of medians; it is reported as a ratio to the measured update and as an
absolute cost scaled to a 100 ms update (the DESIGN goal: ≤ 0.5 %).

    python bench/guard.py [--updates 200] [--dim 128] [--layers 4]
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import median, table, write_json

from accelpact.testing.spawn import run_world


def worker(rank: int, world: int, updates: int, dim: int, layers: int, framework: str) -> dict:
    import accelpact
    from accelpact.workloads import build_hsdp_job, next_token_loss

    model, opt, data = build_hsdp_job(framework, layers=layers, dim=dim, seed=1, seq_len=32, batch_size=8)
    rt = accelpact.attach(model, opt, data_state=data,
                          config=accelpact.Config(data_timeout_s=10, control_timeout_s=60))

    def step():
        loss = next_token_loss(model, data.next_batch())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    guarded, plain, boundary = [], [], []
    for i in range(updates + 10):
        t0 = time.perf_counter()
        if i % 2:
            with rt.update():
                step()
                t_body = time.perf_counter()
            t1 = time.perf_counter()
            if i >= 10:
                guarded.append(t1 - t0)
                boundary.append(t1 - t_body)
        else:
            step()
            t1 = time.perf_counter()
            if i >= 10:
                plain.append(t1 - t0)
    rt.close()
    return {"guarded": guarded, "plain": plain, "boundary": boundary}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--framework", default="fsdp2")
    args = ap.parse_args(argv)
    results = run_world(worker, 4, args.updates, args.dim, args.layers, args.framework,
                        timeout_s=600, pg_timeout_s=60)
    rows, out = [], []
    for r in range(4):
        res = results[r]
        g, p, b = median(res["guarded"]), median(res["plain"]), median(res["boundary"])
        rows.append([r, f"{p * 1e3:.2f}", f"{g * 1e3:.2f}", f"{(g - p) * 1e3:+.3f}", f"{g / p:.4f}",
                     f"{b * 1e3:.3f}", f"{b / 0.1 * 100:.2f}%"])
        out.append({"rank": r, "plain_s": p, "guarded_s": g, "boundary_s": b, "ratio": g / p})
    print(f"paired guarded vs unguarded updates ({args.framework}, dim {args.dim}, {args.layers} layers, "
          f"{args.updates // 2} pairs)")
    print(table(["rank", "plain ms", "guarded ms", "delta ms", "ratio", "boundary ms", "of 100 ms"], rows))
    path = write_json("guard", {"args": vars(args), "ranks": out})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
