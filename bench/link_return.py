"""After a link cut is lifted: when does a connection stalled across it resume, and when does a
fresh one get through? What probing a returning link with fresh connections could save.

Two emulated nodes (`accelpact.chaos.topology`: network namespaces, a bridge). Node 0 runs a
request/echo loop over one TCP connection to node 1 (1 KiB each way, the shape of a small
collective), with its retransmission back-off capped at 1 s as AccelPact caps its group
connections (`comm/connections.py`, TCP_RTO_MAX_MS); beside it a prober opens a fresh connection
every 10 ms (50 ms connect timeout). The cut (`accelpact.chaos.nemesis`: port-block, switch-down,
...) lasts `--cut` seconds; the figures are seconds from the restore to the first echo on the
stalled connection, and to the start of the first fresh connection that got through.

AccelPact acts on the answer: a rank that saw a failure probes this way before it sends its
boundary check (`control/reach.py`, `runtime/link_wait.py`, `Config.link_probe_s`).

Where the restore falls in the stalled connection's back-off schedule decides its wait, so
several cut lengths are run. Needs root and iproute2, like `make chaos`.

`--kicks` asks whether the stalled connection can be made to send again from user space once a
fresh one got through (the link is back, the connection still waits): each named kick is applied
to it at that moment, one run per kick and cut, side by side with `none`. `nodelay` sets
TCP_NODELAY again (which pushes pending frames), `rtomax` sets TCP_RTO_MAX_MS again, `cong` switches
its congestion control to reno, `send` writes one more byte. The answer decides whether probing
could shorten a stall without moving to new connections.

    python bench/link_return.py [--methods port-block,switch-down] [--cuts 2.5,3.0,3.3,3.6]
                                [--kicks none,nodelay,rtomax,cong,send]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

from _common import median, table, write_json

PORT = 40123
TCP_RTO_MAX_MS = 44  # linux/tcp.h, Linux >= 6.15


def serve(host: str) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, PORT))
    listener.listen(16)

    def echo(conn: socket.socket) -> None:
        while data := conn.recv(65536):
            conn.sendall(data)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


KICKS = ("none", "nodelay", "rtomax", "cong", "send")


def _kick(conn: socket.socket, kick: str) -> None:
    """Apply one kick (see the module docstring) to the stalled connection."""
    if kick == "nodelay":
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    elif kick == "rtomax":
        conn.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, 1000)
    elif kick == "cong":
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
    elif kick == "send":
        conn.send(b"k")  # the echo comes back as one more byte of the next round


def client(host: str, seconds: float, kick: str = "none") -> None:
    """Echo rounds on one connection and fresh-connection probes beside them; prints their times.
    The first fresh connection that gets through while the echo loop has been stalled for 0.5 s
    applies `kick` to the stalled connection."""
    conn = socket.create_connection((host, PORT))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        conn.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, 1000)
        capped = True
    except OSError:
        capped = False
    echoed: list[float] = []
    fresh: list[float] = []
    kicked: list[float] = []

    def probe() -> None:
        while True:
            t = time.monotonic()
            try:
                socket.create_connection((host, PORT), timeout=0.05).close()
                fresh.append(t)
                if not kicked and echoed and time.monotonic() - echoed[-1] > 0.5:  # stalled; the link is back
                    kicked.append(time.monotonic())
                    _kick(conn, kick)
            except OSError:
                pass
            time.sleep(0.01)

    threading.Thread(target=probe, daemon=True).start()
    end, msg = time.monotonic() + seconds, b"x" * 1024
    while time.monotonic() < end:
        conn.sendall(msg)
        got = 0
        while got < len(msg):
            got += len(conn.recv(65536))
        echoed.append(time.monotonic())
        time.sleep(0.005)
    print(json.dumps({"capped": capped, "echoed": echoed, "fresh": fresh, "kicked": kicked}))


def one_cut(method: str, cut_s: float, kick: str = "none") -> dict:
    from accelpact.chaos.nemesis import CutMethod, cut_commands
    from accelpact.chaos.topology import emulated_nodes

    me = os.path.abspath(__file__)
    with emulated_nodes(nodes=2) as topo:
        far = topo.spec.address(1)
        server = subprocess.Popen(topo.exec_argv(1, [sys.executable, me, "--serve", far]))
        try:
            time.sleep(0.5)
            loop = subprocess.Popen(topo.exec_argv(0, [sys.executable, me, "--client", far, str(cut_s + 3.5), kick]),
                                    stdout=subprocess.PIPE, text=True)
            time.sleep(1.5)
            cut, restore = cut_commands(topo.spec, CutMethod(method), 1)
            for argv in cut:
                subprocess.run(argv, check=True)
            time.sleep(cut_s)
            restored = time.monotonic()
            for argv in restore:
                subprocess.run(argv, check=True)
            out = json.loads(loop.communicate(timeout=cut_s + 30)[0])
        finally:
            server.kill()
    after = [t - restored for t in out["echoed"] if t > restored]
    fresh = [t - restored for t in out["fresh"] if t > restored]
    return {"method": method, "cut_s": cut_s, "capped": out["capped"], "kick": kick,
            "kicked_s": out["kicked"][0] - restored if out["kicked"] else None,
            "stalled_resumes_s": after[0] if after else None, "fresh_connects_s": fresh[0] if fresh else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="port-block,switch-down")
    ap.add_argument("--cuts", default="2.5,3.0,3.3,3.6", help="cut lengths, seconds")
    ap.add_argument("--serve", metavar="HOST", help=argparse.SUPPRESS)
    ap.add_argument("--kicks", default="none", help=f"kicks to compare, comma-separated, of {','.join(KICKS)}")
    ap.add_argument("--client", nargs=3, metavar=("HOST", "SECONDS", "KICK"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    if args.client:
        client(args.client[0], float(args.client[1]), args.client[2])
        return 0
    from accelpact.chaos.topology import ChaosUnavailable, preflight

    try:
        preflight()
    except ChaosUnavailable as exc:
        print(f"link_return: {exc}")
        return 2
    kicks = [k.strip() for k in args.kicks.split(",") if k.strip()]
    unknown = sorted(set(kicks) - set(KICKS))
    if unknown:
        ap.error(f"unknown kick(s) {unknown}: choose from {','.join(KICKS)}")
    load_before = [round(x, 2) for x in os.getloadavg()]
    rows = [one_cut(m, float(c), k) for m in args.methods.split(",") for c in args.cuts.split(",") for k in kicks]
    print(f"after the restore (back-off capped at 1 s: {all(r['capped'] for r in rows)}), load {load_before} -> "
          f"{[round(x, 2) for x in os.getloadavg()]}")
    print(table(["cut", "cut s", "kick", "kicked at s", "stalled connection resumes s", "a fresh connection gets through s"],
                [[r["method"], r["cut_s"], r["kick"], "-" if r["kicked_s"] is None else f"{r['kicked_s']:.3f}",
                  f"{r['stalled_resumes_s']:.3f}", f"{r['fresh_connects_s']:.3f}"] for r in rows]))
    for m in args.methods.split(","):
        for k in kicks:
            mine = [r for r in rows if r["method"] == m and r["kick"] == k]
            print(f"{m}, kick {k}: median {median([r['stalled_resumes_s'] for r in mine]):.3f} s on the stalled "
                  f"connection, {median([r['fresh_connects_s'] for r in mine]):.3f} s for a fresh one")
    if len(kicks) > 1:
        print("a kick helps only if its stalled connection resumes well before the same cut's `none` run")
    path = write_json("link-return" if kicks == ["none"] else "link-return-kicks", {"load_before": load_before, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
