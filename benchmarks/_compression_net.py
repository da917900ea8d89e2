"""The shaped namespace cluster of benchmarks/compression_bench.py: links
capped in both directions, the link rate as plain TCP sees it, and jobs
started with tfring-run over ssh.

Each host's veth pair gets a tc tbf qdisc on both ends: on the host's eth0
(what the host sends) and on the switch's port towards it (what it
receives). A host's traffic in either direction therefore passes a token
bucket of the rate, as a host behind a switch port of that speed would see;
no delay is added (no netem).
"""

import json
import os
import subprocess
import sys
import time

# tbf: a 256 KB bucket (bursts at line speed stay below a millisecond at
# 300 Mbit/s) and packets queue up to 50 ms before being dropped, as
# tests/cluster.py shapes its links.
TBF = ("burst", "256kb", "latency", "50ms")

# The plain-TCP probe: `recv PORT` prints "ready", then one JSON line with
# the bytes it read and the seconds from the first to the last byte;
# `send ADDR PORT SECONDS` streams zeros for that long.
_PROBE_SRC = r"""
import json, socket, sys, time
if sys.argv[1] == "recv":
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(sys.argv[2])))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    buf = bytearray(1 << 20)
    total, first, last = 0, None, None
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        now = time.perf_counter()
        if first is None:
            first = now
        else:
            total += n  # bytes after the first read, over the time since it
        last = now
    print(json.dumps({"bytes": total, "seconds": (last or 0) - (first or 0)}), flush=True)
else:
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=30)
    chunk = bytes(1 << 20)
    end = time.perf_counter() + float(sys.argv[4])
    while time.perf_counter() < end:
        s.sendall(chunk)
    s.close()
"""

PROBE_PORT = 29511


def shape(cluster_mod, c, rate_mbit):
    """Caps every host's link at rate_mbit in both directions (tbf on both
    veth ends); rate_mbit 0 or None removes the caps."""
    for h in c.hosts:
        for ns, dev in ((h.ns, "eth0"), (c.switch, f"p{h.index}")):
            if rate_mbit:
                cluster_mod._run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                                 "handle", "10:", "tbf", "rate", f"{rate_mbit:g}mbit", *TBF)
            else:
                cluster_mod._run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root",
                                 check=False)


def tcp_rate(cluster_mod, src, dst, seconds):
    """Mbit/s of one TCP stream from host src to host dst (goodput: payload
    bytes the receiver read per second)."""
    recv = dst.popen([cluster_mod.PYTHON, "-c", _PROBE_SRC, "recv", str(PROBE_PORT)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError(f"link probe on {dst.name} did not start: "
                               f"{recv.stderr.read()[-1000:]}")
        out = src.run([cluster_mod.PYTHON, "-c", _PROBE_SRC, "send", dst.addr,
                       str(PROBE_PORT), str(seconds)], timeout=seconds + 30)
        if out.returncode != 0:
            raise RuntimeError(f"link probe sender on {src.name} failed: {out.stderr[-1000:]}")
        line, err = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            src.cluster.kill(recv)
    r = json.loads(line.strip().splitlines()[-1])
    if r["seconds"] <= 0:
        raise RuntimeError(f"link probe {src.name} -> {dst.name} read nothing: {err[-500:]}")
    return r["bytes"] * 8 / r["seconds"] / 1e6


def measure_link(cluster_mod, c, seconds=3.0):
    """{"h1->h2": Mbit/s, "h2->h1": Mbit/s, "mbit": the lower}: plain TCP
    between the first two hosts, one direction after the other."""
    a, b = c.hosts[0], c.hosts[1]
    fwd = tcp_rate(cluster_mod, a, b, seconds)
    back = tcp_rate(cluster_mod, b, a, seconds)
    return {f"{a.name}->{b.name}": round(fwd, 1), f"{b.name}->{a.name}": round(back, 1),
            "mbit": round(min(fwd, back), 1), "seconds": seconds}


def run_job(cluster_mod, c, nhosts, argv, timeout, label, env=None):
    """``tfring-run -np nhosts -H host1:1,...`` of ``argv`` (a command on the
    namespace hosts, one rank each), launched on host1; ranks on the other
    hosts start over ssh. Raises RuntimeError with the output's tail when
    the job fails."""
    from _common import tfring_path

    hosts = ",".join(f"{h.name}:1" for h in c.hosts[:nhosts])
    env_extra = env
    env = cluster_mod.launch_env(TFRING_TIMEOUT=300, **(env or {}))
    # The ranks import the tfring this interpreter imports (a build's
    # package dir on PYTHONPATH, or the checkout).
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([tfring_path(), cluster_mod.ROOT]))
    # -P: the working directory (the checkout) does not go first on sys.path,
    # so the launcher imports the same tfring as the ranks.
    cmd = [cluster_mod.PYTHON, "-P", "-m", "tfring.run", "-np", str(nhosts), "-H", hosts,
           "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "--timeout", str(int(timeout))]
    for k in sorted(env_extra or {}):
        cmd += ["-x", k]
    cmd += argv
    t0 = time.monotonic()
    out = c.hosts[0].run(cmd, env=env, cwd=cluster_mod.ROOT, timeout=timeout + 60)
    if out.returncode != 0:
        raise RuntimeError(f"{label}: tfring-run exit code {out.returncode}:\n"
                           f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    print(f"compression_bench: {label} done in {time.monotonic() - t0:.0f} s",
          file=sys.stderr, flush=True)
    return out


def load():
    """The machine's 1-minute load average and core count, for the report."""
    try:
        one = os.getloadavg()[0]
    except OSError:
        one = float("nan")
    return {"load1": round(one, 2), "cpus": os.cpu_count()}
