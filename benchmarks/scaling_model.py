#!/usr/bin/env python3
"""Scale on paper: an alpha-beta model of tfring's allreduce and agreement
round, calibrated from the benchmarks' JSON, predicting one collective's
time for every algorithm (beside NCCL's own tuning model) and the
data-parallel step time and scaling efficiency of ResNet-50 and BERT-large
from 8 to 1024 GPUs.

    python benchmarks/hop_cost.py --json hops.json           # alpha per hop, measured
    python benchmarks/scaling_model.py --hops-json hops.json --net-latency-us 2
    python benchmarks/allreduce_bench.py --json cpu.json     # or from the CPU sweep
    python benchmarks/scaling_model.py --cpu-json cpu.json [--gpu-json gpu_bench.json]
    python benchmarks/scaling_model.py --json model.json     # published figures only

Every collective is a list of phases, (link, sequential hops, bytes through
the slowest link of that kind), with the hop counts the core reports in
_core.last_collective_stats() (see phases()); the formulas below are its
ring and hierarchical cases. A step carries one agreement round (the vote:
today a ring allgather, N-1 hops; or recursive doubling, ceil(log2 N) + 1
hops for N not a power of two) per fused buffer. docs/scale.md has the
tables.

The model (Hockney's alpha-beta, per link type):

- one collective of S bytes costs alpha_coll + steps * alpha_step +
  sum over phases of (bytes through the slowest link of the phase) / beta;
- a tensor in a fused buffer adds alpha_tensor (pack, unpack, bookkeeping).

Flat ring over P GPUs on n nodes of g (P = n g): 2(P-1) steps, and every
byte of a node's 2(P-1)/P * S crosses its network link when n > 1:

    T_flat = alpha_coll + 2(P-1) alpha_step_net + 2(P-1)/P * S / beta_net

(n = 1: alpha_step_intra and beta_intra instead.) Hierarchical: reduce-
scatter inside each node, a ring over the n nodes for each GPU's 1/g share
(g such rings share the node's link), allgather inside the node:

    T_hier = alpha_coll + 2(g-1) alpha_step_intra + 2(g-1)/g * S / beta_intra
                        + 2(n-1) alpha_step_net   + 2(n-1)/n * S / beta_net

Bandwidth terms nearly agree (a ring is bandwidth-optimal either way); the
hierarchy's gain is 2(n-1) instead of 2(P-1) latency steps.

A step: forward (1/3 of the compute time) then backward (2/3); a layer's
gradients are ready when backward has done its share of the MACs (model_zoo
gives MACs per tensor), last layer first. Tensors are fused in ready order
into buffers sent when they reach the fusion threshold, or when the cycle
time has passed since the buffer's first tensor, or at the last gradient;
buffers go one after another. Exposed communication = finish of the last
buffer - end of compute; step = compute + exposed; scaling efficiency =
compute / step (a single GPU does no communication).

Parameters and where each comes from (printed with every run):

- alpha_coll, alpha_step, alpha_tensor, beta_shm: the CPU sweep's JSON
  (allreduce_bench.py --json). The core's latency at its smallest size,
  less that size's bandwidth term, at each measured rank count N, fitted to
  alpha_coll + 2(N-1) alpha_step (least squares; one N: all in alpha_coll);
  beta_shm = the core's busbw at the largest size; alpha_tensor = (fused
  batch time - the model's one collective of the batch's total bytes) /
  tensors, from the batch of grouped_allreduce in a tf.function (else the
  allreduce_async batch).
- The GPU table's JSON (gpu_bench.py --json), when given (the --mode mps
  one of several; dry runs and emulation output are refused): the same fit
  on its latency rows (ring algorithm) for alpha_coll and alpha_step_intra,
  its 256-tensor batch for alpha_tensor, and, when it measured NCCL across
  several GPUs, beta_intra. Its ranks share one GPU, so its alphas are an
  upper bound for GPUs of their own. Otherwise alphas from the CPU JSON.
- Published: beta_intra = 370 GB/s, NCCL's all-reduce bus bandwidth on 8
  H100 SXM over NVLink (NVIDIA's nccl-tests figures for DGX H100); beta_net
  = 25, 100, 200 or 400 Gb/s per node (Ethernet/InfiniBand line rates, one
  NIC per node unless --nics-per-node). The network's own latency is not
  in any JSON: alpha_step_net = alpha_step + --net-latency-us (default 0).
- Compute per step: --compute-ms MODEL=MS, default derived from the
  architecture: 3 * MACs * 2 FLOP/MAC * batch / --gpu-tflops (assumed
  sustained, default 200 TFLOP/s, about 20% of the H100 SXM's 989 TFLOP/s
  dense bf16 peak in NVIDIA's datasheet), --batch 64 images / 32 sequences
  of 128 tokens per GPU.
- Reference: Horovod (Sergeev & Del Balso 2018, arXiv:1802.05799) reports
  about 90% scaling efficiency at 512 GPUs (128 servers of 4 Pascal GPUs,
  25 Gbit/s RoCE) for Inception V3 and ResNet-101, 68% for VGG-16.

Without any JSON the alphas are unknown: the model then says so and predicts
with alpha = 0, a bandwidth-only lower bound on the time.
"""

import argparse
import json
import math
import os
import sys

from model_zoo import MODELS

GB = 1e9
PUBLISHED = {
    "beta_intra_gbs": (370.0, "NCCL all-reduce busbw, 8x H100 SXM NVLink (nccl-tests, DGX H100)"),
    "net_gbits": ((25, 100, 200, 400), "Ethernet/InfiniBand line rates between hosts"),
    "horovod_512_eff": (0.90, "Horovod paper (Sergeev & Del Balso 2018): ~90% at 512 GPUs, "
                              "Inception V3 and ResNet-101, 25 Gbit/s RoCE"),
    "h100_bf16_tflops": (989.0, "H100 SXM dense bf16 peak, NVIDIA datasheet"),
}
GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)
SCALE_GPUS = (64, 128, 256, 512, 1024)
COLL_SIZES = (4 << 10, 1 << 20, 64 << 20)
FUSION_THRESHOLDS = [1 << k for k in range(20, 28)]  # 1 MiB .. 128 MiB
CYCLE_TIMES_S = (0.5e-3, 1e-3, 2e-3, 5e-3, 10e-3)

# ------------------------------------------------------------- the model --


def ring_time(size, procs, alpha_step, beta):
    """One ring allreduce's steps and bytes: 2(P-1) alpha + 2(P-1)/P S / beta."""
    if procs <= 1:
        return 0.0
    return 2 * (procs - 1) * alpha_step + 2 * (procs - 1) / procs * size / beta


def _layout(gpus, per_node):
    """(g, n): GPUs per node and nodes (g = gpus on one node)."""
    g = min(per_node, gpus)
    return g, max(1, gpus // g)


def _log2(x):
    """floor(log2 x) for x >= 1."""
    return x.bit_length() - 1


def phases(algo, size, gpus, per_node, vote_bytes=0):
    """The sequential message steps of one collective on ``gpus`` GPUs, ``per_node``
    a node, as [(link, hops, bytes)]: ``hops`` steps on the critical path over
    ``link`` ("intra": NVLink or shared memory; "net": between nodes), and the
    bytes those steps push through the slowest link of their kind (one GPU's
    link inside a node, the node's NIC, which the node's GPUs share). The hop
    counts are those ``_core.last_collective_stats()`` reports (allreduce.h):

    ring          2(P-1) hops, 2(P-1)/P S per rank (on the net when n > 1:
                  a step waits for its slowest link);
    hier          2 hops in the node (reduce-scatter, allgather through the
                  host segment, 2(g-1)/g S) + a ring over the n nodes for each
                  GPU's 1/g share: 2(n-1) hops, 2(n-1)/n S through the NIC;
    small         2 hops in the node + one allgather of the shares across
                  nodes: n-1 hops, (n-1) S through the NIC;
    recdbl        log2(p) exchanges of the whole buffer (p the largest power
                  of two <= P), +2 fold hops of S when P != p; exchanges at
                  distance < g stay in the node, the others put g S through
                  the NIC each;
    rabenseifner  recursive halving then doubling: 2 log2(p) exchanges (+2
                  fold hops), the one at distance m carrying S m / p per rank;
    vote_ring     today's agreement: an allgather of every rank's vote of
                  ``vote_bytes`` round the ring, P-1 hops, (P-1) V per rank;
    vote_log      recursive doubling of the votes: log2(p) hops of V (+2
                  fold hops when P != p), ceil(log2 P) + 1 for P not a power
                  of two;
    vote_host     the host vote: 2 hops in the node (votes into the host
                  segment, the tally back) + recursive doubling among the n
                  nodes' first ranks, log2(pn) hops (+2 when n != pn), V
                  through the NIC per hop (one sender per node).
    """
    g, n = _layout(gpus, per_node)
    P, S, V = gpus, float(size), float(vote_bytes)
    if P <= 1:
        return []
    net = "net" if n > 1 else "intra"
    if algo in ("ring", "flat") or (algo == "hier" and n == 1):
        return [(net, 2 * (P - 1), 2 * (P - 1) / P * S)]
    if algo in ("hier", "small"):
        if n == 1:  # the one-shot scheme: one synchronisation in the segment
            return [("intra", 1, S)]
        out = [("intra", 2, 2 * (g - 1) / g * S)] if g > 1 else []
        if algo == "hier":
            return out + [("net", 2 * (n - 1), 2 * (n - 1) / n * S)]
        return out + [("net", n - 1, (n - 1) * S)]
    if algo == "vote_ring":
        return [(net, P - 1, (P - 1) * V)]
    if algo == "vote_host" and n > 1:
        ln = _log2(n)
        out = [("intra", 2, 2 * V)] if g > 1 else []
        if n != 1 << ln:
            out.append(("net", 2, 2 * V))
        return out + ([("net", ln, ln * V)] if ln else [])
    if algo == "vote_host":  # one node: the host vote runs as recursive doubling
        algo = "vote_log"
    lg = _log2(P)
    p = 1 << lg
    fold = P != p
    lg_in = min(lg, _log2(g)) if n > 1 else lg  # exchanges at distance < g
    out = [("intra" if g > 1 else net, 2, 2 * (V if algo == "vote_log" else S))] if fold else []
    if algo in ("recdbl", "vote_log"):
        unit = V if algo == "vote_log" else S
        if lg_in:
            out.append(("intra", lg_in, lg_in * unit))
        if lg - lg_in:
            out.append(("net", lg - lg_in, (lg - lg_in) * g * unit))
        return out
    if algo == "rabenseifner":
        ms = [1 << k for k in range(lg)]
        intra = [m for m in ms if m < (1 << lg_in)]
        net_ms = [m for m in ms if m >= (1 << lg_in)]
        if intra:
            out.append(("intra", 2 * len(intra), 2 * sum(S * m / p for m in intra)))
        if net_ms:
            out.append(("net", 2 * len(net_ms), 2 * sum(g * S * m / p for m in net_ms)))
        return out
    raise ValueError(f"unknown algorithm {algo!r}")


def hops(algo, gpus, per_node=1):
    """Sequential hops on the critical path (the sum over phases)."""
    return sum(h for _, h, _ in phases(algo, 1, gpus, per_node))


def auto_algo(size, gpus, per_node, small_threshold=32 << 10):
    """The core's automatic choice (collectives/allreduce.h): one node:
    one-shot up to the threshold, ring above; across nodes with at least 8
    ranks on at least 4 nodes: recursive doubling up to the threshold,
    hierarchical above (every node here has the same GPU count); otherwise
    the small cross-host scheme up to the threshold, hierarchical above."""
    g, n = _layout(gpus, per_node)
    if n == 1:
        return "small" if size <= small_threshold else "ring"
    if gpus >= 8 and n >= 4:
        return "recdbl" if size <= small_threshold else "hier"
    return "small" if size <= small_threshold else "hier"


def phase_time(ph, p):
    """Seconds of the phases under parameters ``p`` (alpha_step_intra,
    alpha_step_net: a hop; beta_intra, beta_net: bytes/s)."""
    return sum(h * p["alpha_step_" + link] + b / p["beta_" + link] for link, h, b in ph)


def allreduce_time(size, p, algo):
    """Seconds for one allreduce of ``size`` bytes under parameters ``p``
    (dict: alpha_coll, alpha_step_intra, alpha_step_net, beta_intra, beta_net,
    gpus, per_node), ``algo`` one of phases()'s allreduces or "auto"."""
    if algo == "auto":
        algo = auto_algo(size, p["gpus"], p["per_node"], p.get("small_threshold", 32 << 10))
    return p["alpha_coll"] + phase_time(phases(algo, size, p["gpus"], p["per_node"]), p)


def vote_bytes(tensors):
    """One rank's vote in a steady-state round (runtime/engine_round.cc): int32
    words, 2 of header, one per cached tensor id, 25 of fresh names."""
    return 4 * (2 + tensors + 25)


def vote_time(p, algo, tensors):
    """Seconds of one agreement round ("vote_ring", "vote_log" or "vote_host")."""
    return phase_time(phases(algo, 0, p["gpus"], p["per_node"], vote_bytes(tensors)), p)


# NCCL's own cost model (NVIDIA/nccl v2.28, src/graph/tuning.cc,
# ncclTunerConstantsDefaults and ncclTopoTuneModel): latencies in us, per
# algorithm and protocol (LL, Simple); a ring allreduce costs
# base + (2(P-1) - 2(n-1)) intra + 2(n-1) net (intra x 1.8 for LL across
# nodes; Simple's latency x 1.9 from S >= P/16 x 64 KiB across nodes), the
# double binary tree base + 2((g-1) intra + floor(log2 n) net); bandwidth:
# the bus bandwidth (the node's NIC across nodes, NVLink inside one) x 1/4
# for the ring's LL, x 0.9 (x 1/3.8 for LL) for the tree; the ring's
# algorithm bandwidth is busbw P / 2(P-1), the tree's busbw / 2. NCCL takes
# the fastest protocol for each size.
NCCL = {
    "ring": {"LL": (6.6, 0.6, 2.7), "Simple": (8.4, 3.4, 14.0)},  # base, NVLink hop, net hop
    "tree": {"LL": (6.8, 0.6, 5.0), "Simple": (8.4, 4.0, 14.0)},
}


def nccl_time(size, gpus, per_node, algo, beta_intra, beta_net):
    """Seconds NCCL's tuning model predicts for an allreduce ("ring" or "tree")."""
    g, n = _layout(gpus, per_node)
    P = gpus
    if P <= 1:
        return 0.0
    best = math.inf
    for proto, (base, intra, inter) in NCCL[algo].items():
        if n > 1 and proto == "LL":
            intra *= 1.8
        bus = beta_net if n > 1 else beta_intra
        if algo == "ring":
            lat = base + (2 * (P - 1) - 2 * (n - 1)) * intra + 2 * (n - 1) * inter
            if proto == "Simple" and n > 1 and size >= P / 16 * 65536:
                lat *= 1.9
            bus *= 0.25 if proto == "LL" else 1.0
            algbw = bus * P / (2 * (P - 1))
        else:
            lat = base + 2 * ((g - 1) * intra + _log2(n) * inter)
            bus *= 0.9 / 3.8 if proto == "LL" else 0.9
            algbw = bus * 0.5
        best = min(best, lat * 1e-6 + size / algbw)
    return best


def ready_times(tensors, compute_s):
    """(bytes, ready seconds) per tensor in backward order: forward takes a
    third of ``compute_s``, backward the rest, spent on layers in proportion
    to their MACs, last layer first."""
    fwd, bwd = compute_s / 3, 2 * compute_s / 3
    total = sum(t.macs for t in tensors) or 1
    out, done = [], 0
    for t in reversed(tensors):
        done += t.macs
        out.append((4 * t.elems, fwd + bwd * done / total))
    return out


def fuse(ready, threshold, cycle):
    """Buffers as (bytes, tensors, send time): a buffer is sent when it
    reaches ``threshold`` bytes, when ``cycle`` seconds passed since its
    first tensor was ready (at the next tensor's arrival or the deadline),
    or with the last gradient."""
    buffers, cur, count, first = [], 0, 0, None
    for nbytes, t in ready:
        if cur and t > first + cycle:  # the deadline passed before this tensor
            buffers.append((cur, count, first + cycle))
            cur, count, first = 0, 0, None
        if first is None:
            first = t
        cur, count = cur + nbytes, count + 1
        if cur >= threshold:
            buffers.append((cur, count, t))
            cur, count, first = 0, 0, None
    if cur:
        buffers.append((cur, count, ready[-1][1]))
    return buffers


# A scheme: the allreduce algorithm and the agreement round of every fused
# buffer. "flat" is today's engine (ring allreduce, ring vote); "hier" the
# hierarchical allreduce with the ring vote; "new" the automatic choice
# (recursive doubling for small buffers across nodes, hierarchical above)
# with the recursive-doubling vote.
SCHEMES = {"flat": ("flat", "vote_ring"), "hier": ("hier", "vote_ring"),
           "new": ("auto", "vote_log")}


def step_time(tensors, compute_s, p, algo, threshold, cycle, vote=None):
    """(step seconds, exposed communication seconds, total communication
    seconds) of one training step: ``algo`` an allreduce algorithm of
    phases() or "auto", ``vote`` "vote_ring", "vote_log" or None (no
    agreement cost), one round per fused buffer."""
    busy_until, comm = 0.0, 0.0
    for nbytes, count, send in fuse(ready_times(tensors, compute_s), threshold, cycle):
        t = allreduce_time(nbytes, p, algo) + count * p["alpha_tensor"]
        if vote:
            t += vote_time(p, vote, len(tensors))
        comm += t
        busy_until = max(busy_until, send) + t
    exposed = max(0.0, busy_until - compute_s)
    return compute_s + exposed, exposed, comm


def scheme_step(tensors, compute_s, p, scheme, threshold, cycle):
    """step_time() of a SCHEMES entry, its vote included."""
    algo, vote = SCHEMES[scheme]
    return step_time(tensors, compute_s, p, algo, threshold, cycle, vote)


def compute_for_efficiency(tensors, p, scheme, threshold, cycle, target):
    """The least compute seconds per step at which the predicted scaling
    efficiency of SCHEMES[``scheme``] reaches ``target`` (bisection;
    efficiency grows with compute as more communication hides behind
    backward)."""
    def eff(c):
        return c / scheme_step(tensors, c, p, scheme, threshold, cycle)[0]

    lo, hi = 1e-6, 1.0
    while eff(hi) < target and hi < 1e4:
        hi *= 2
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if eff(mid) < target else (lo, mid)
    return hi


# ------------------------------------------------------------ calibration --


def _fit_alpha(points):
    """points: [(N, latency s)] -> (alpha_coll, alpha_step) fitted to
    t = alpha_coll + 2(N-1) alpha_step by least squares, both >= 0."""
    if not points:
        return None, None
    xs = [2 * (n - 1) for n, _ in points]
    ys = [t for _, t in points]
    if len(set(xs)) < 2:
        return sum(ys) / len(ys), 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, slope)
    return max(0.0, my - slope * mx), slope


def calibrate_cpu(doc):
    """Parameters from allreduce_bench.py's JSON: alpha_coll, alpha_step,
    alpha_tensor, beta_shm (bytes/s) and notes saying from which rows."""
    out, notes, latency = {}, [], []
    runs = sorted(doc["runs"], key=lambda r: r["np"])
    multi = [r for r in runs if r["np"] > 1 and any("tfring" in x for x in r["results"])]
    if multi:
        run = multi[0]
        rows = sorted((x for x in run["results"] if "tfring" in x), key=lambda x: x["size"])
        out["beta_shm"] = rows[-1]["tfring"]["busbw_gbs"] * GB
        notes.append(f"beta_shm: core busbw at {rows[-1]['size']} B, {run['np']} ranks")
    for r in runs:
        rows = sorted((x for x in r["results"] if "tfring" in x), key=lambda x: x["size"])
        if not rows:
            continue
        n, s, t = r["np"], rows[0]["size"], rows[0]["tfring"]["time_s"]
        bw_term = 2 * (n - 1) / n * s / out["beta_shm"] if n > 1 and "beta_shm" in out else 0
        latency.append((n, max(0.0, t - bw_term)))
    out["alpha_coll"], out["alpha_step"] = _fit_alpha(latency)
    if latency:
        notes.append("alpha_coll, alpha_step: core latency at the smallest size, fitted over "
                     f"N = {', '.join(str(n) for n, _ in latency)}")
    for r in runs:
        if r["np"] < 2 or "beta_shm" not in out:
            continue
        for b in r.get("batches", []):
            res = b["results"]
            path = next((k for k in ("tf_grouped_function", "core_async") if k in res), None)
            if path is None:
                continue
            n, total = r["np"], b["count"] * b["tensor_bytes"]
            one = out["alpha_coll"] + ring_time(total, n, out["alpha_step"], out["beta_shm"])
            out["alpha_tensor"] = max(0.0, (res[path]["time_s"] - one) / b["count"])
            notes.append(f"alpha_tensor: {b['count']} x {b['tensor_bytes']} B batch ({path}), "
                         f"{n} ranks")
            break
        if "alpha_tensor" in out:
            break
    return out, notes


def calibrate_gpu(doc):
    """Parameters from gpu_bench.py's JSON: alpha_coll, alpha_step_intra,
    alpha_tensor and (NCCL across GPUs) beta_intra, with notes."""
    out, notes = {}, []
    rows = [r for r in doc.get("allreduce", []) if r.get("kind") == "latency" and r.get("ok")]
    ring = [r for r in rows if r.get("algo") == "ring"] or rows
    by_n = {}
    for r in ring:
        cur = by_n.get(r["procs"])
        if cur is None or r["bytes"] < cur["bytes"]:
            by_n[r["procs"]] = r
    pts = [(n, r["seconds"]) for n, r in sorted(by_n.items())]
    if pts:
        out["alpha_coll"], out["alpha_step_intra"] = _fit_alpha(pts)
        notes.append(f"GPU alpha_coll, alpha_step_intra: latency rows ({ring[0].get('algo')}), "
                     f"N = {', '.join(str(n) for n, _ in pts)}")
    for b in doc.get("batch", []):
        if b.get("ok") and b.get("procs", 1) >= 1 and "per_tensor_s" in b:
            out["alpha_tensor"] = b["per_tensor_s"]
            notes.append(f"GPU alpha_tensor: {b['count']}-tensor batch, {b['procs']} rank(s)")
            break
    multi = (doc.get("nccl") or {}).get("multi")
    if multi and multi.get("results"):
        r = max(multi["results"], key=lambda x: x["bytes"])
        n = multi.get("procs", 2)
        out["beta_intra"] = r["bytes"] / r["seconds"] * 2 * (n - 1) / n
        notes.append(f"beta_intra: NCCL across {n} GPUs at {r['bytes']} B (measured)")
    return out, notes


def load_json(path, what):
    """The document at ``path``, or None with a message saying what the
    model uses instead."""
    if path is None:
        return None
    if not os.path.exists(path):
        print(f"scaling_model: {what} {path!r} not found: using published figures only "
              "for what it would have calibrated", file=sys.stderr)
        return None
    with open(path) as f:
        return json.load(f)


def parameters(args):
    """The model's parameters with a source for each."""
    sources = {}
    cpu_doc = load_json(args.cpu_json, "CPU benchmark JSON")
    gpu_doc, gpu_path = None, None
    for path in args.gpu_json or []:
        doc = load_json(path, "GPU benchmark JSON")
        if doc is not None and (doc.get("dry_run") or doc.get("emulated")):
            print(f"scaling_model: {path!r} is a dry run or the CUDA emulation, not a "
                  "measurement: ignored", file=sys.stderr)
            continue
        # Ranks sharing a GPU under MPS come closest to ranks on GPUs of their own.
        if doc is not None and (gpu_doc is None or doc.get("mode") == "mps"):
            gpu_doc, gpu_path = doc, path
    p = {"alpha_coll": 0.0, "alpha_step": 0.0, "alpha_tensor": 0.0,
         "beta_intra": PUBLISHED["beta_intra_gbs"][0] * GB}
    sources["beta_intra"] = "published: " + PUBLISHED["beta_intra_gbs"][1]
    calibrated = False
    if cpu_doc is not None:
        c, notes = calibrate_cpu(cpu_doc)
        for k in ("alpha_coll", "alpha_step", "alpha_tensor", "beta_shm"):
            if c.get(k) is not None:
                p[k] = c[k]
                sources[k] = f"{args.cpu_json}: " + "; ".join(n for n in notes if k in n)
                calibrated = calibrated or k.startswith("alpha")
    hop_doc = load_json(args.hops_json, "hop cost JSON")
    if hop_doc is not None:
        f = hop_doc["fit"]
        p["alpha_coll"], p["alpha_step"] = max(0.0, f["c0_s"]), max(0.0, f["alpha_hop_s"])
        p["beta_hop"] = 1 / f["beta_s_per_byte"] if f["beta_s_per_byte"] > 0 else math.inf
        why = (f"{args.hops_json}: t = c0 + alpha hops + beta bytes_sent fitted over "
               f"{f['points']} timings at N <= {f['max_np']} (hop_cost.py, TCP links)")
        for k in ("alpha_coll", "alpha_step", "beta_hop"):
            sources[k] = why
        calibrated = True
    p["alpha_step_intra"] = p["alpha_step"]
    sources["alpha_step_intra"] = "= alpha_step"
    if gpu_doc is not None:
        c, notes = calibrate_gpu(gpu_doc)
        for k in ("alpha_coll", "alpha_step_intra", "alpha_tensor", "beta_intra"):
            if c.get(k) is not None:
                p[k] = c[k]
                sources[k] = (f"{gpu_path} (mode {gpu_doc.get('mode')}): "
                              + "; ".join(n for n in notes if k in n))
                calibrated = calibrated or k.startswith("alpha")
    base = "alpha_step" if hop_doc is not None else "alpha_step_intra"
    p["alpha_step_net"] = p[base] + args.net_latency_us * 1e-6
    sources["alpha_step_net"] = f"{base} + --net-latency-us {args.net_latency_us:g}"
    if not calibrated:
        sources["alphas"] = ("no benchmark JSON: every alpha is 0, predictions are a "
                             "bandwidth-only lower bound")
    return p, sources


def compute_seconds(args, name, tensors):
    if name in args.compute_ms:
        return args.compute_ms[name] / 1e3, "--compute-ms"
    batch = args.batch[name]
    flops = 3 * sum(t.macs for t in tensors) * 2 * batch
    return flops / (args.gpu_tflops * 1e12), (
        f"3 x {sum(t.macs for t in tensors) / 1e9:.2f} GMAC x 2 FLOP x batch {batch} "
        f"/ {args.gpu_tflops:g} TFLOP/s")


# ---------------------------------------------------------------- output --


ALGOS = ("ring", "hier", "small", "recdbl", "rabenseifner", "auto")


def collective_table(args, p):
    """Per algorithm, size and GPU count: hops and predicted seconds of one
    allreduce, NCCL's own model beside them, and the two votes."""
    gbit = 100.0 if 100.0 in args.net_gbits else args.net_gbits[0]
    rows = []
    for gpus in SCALE_GPUS:
        q = dict(p, gpus=gpus, per_node=args.per_node,
                 beta_net=gbit / 8 * GB * args.nics_per_node)
        for size in COLL_SIZES:
            for algo in ALGOS:
                ran = auto_algo(size, gpus, args.per_node) if algo == "auto" else algo
                rows.append({"gpus": gpus, "net_gbits": gbit, "size": size, "algo": algo,
                             "ran": ran, "hops": hops(ran, gpus, args.per_node),
                             "time_s": allreduce_time(size, q, algo)})
            for algo in ("ring", "tree"):
                rows.append({"gpus": gpus, "net_gbits": gbit, "size": size,
                             "algo": f"nccl_{algo}", "ran": f"nccl_{algo}", "hops": None,
                             "time_s": nccl_time(size, gpus, args.per_node, algo,
                                                 q["beta_intra"], q["beta_net"])})
        for vote in ("vote_ring", "vote_log", "vote_host"):
            rows.append({"gpus": gpus, "net_gbits": gbit, "size": 0, "algo": vote, "ran": vote,
                         "hops": hops(vote, gpus, args.per_node),
                         "time_s": vote_time(q, vote, args.vote_tensors)})
    return rows


def predict(args, p):
    rows, fusion, models = [], [], []
    ref_gpus = 64
    for name, build in MODELS.items():
        tensors = build()
        compute, why = compute_seconds(args, name, tensors)
        for gbit in args.net_gbits:
            beta_net = gbit / 8 * GB * args.nics_per_node
            for gpus in GPUS:
                q = dict(p, gpus=gpus, per_node=args.per_node, beta_net=beta_net)
                for scheme in SCHEMES:
                    knobs = (args.fusion_threshold, args.cycle_time)
                    step, exposed, comm = scheme_step(tensors, compute, q, scheme, *knobs)
                    row = {"model": name, "gpus": gpus, "net_gbits": gbit, "algo": scheme,
                           "compute_s": compute, "comm_s": comm, "exposed_s": exposed,
                           "step_s": step, "efficiency": compute / step}
                    if gpus == 512:
                        row["compute_for_horovod_eff_s"] = compute_for_efficiency(
                            tensors, q, scheme, *knobs, PUBLISHED["horovod_512_eff"][0])
                    rows.append(row)
            # The fusion knobs minimising exposed communication (the new
            # scheme, ref_gpus GPUs, this network).
            q = dict(p, gpus=ref_gpus, per_node=args.per_node, beta_net=beta_net)
            best = min(((scheme_step(tensors, compute, q, "new", f, c)[1], f, c)
                        for f in FUSION_THRESHOLDS for c in CYCLE_TIMES_S),
                       key=lambda x: (round(x[0], 9), -x[1], x[2]))
            fusion.append({"model": name, "gpus": ref_gpus, "net_gbits": gbit,
                           "fusion_threshold": best[1], "cycle_time_s": best[2],
                           "exposed_s": best[0]})
        models.append({"model": name, "compute_s": compute, "compute_source": why,
                       "tensors": len(tensors), "bytes": 4 * sum(t.elems for t in tensors)})
    return rows, fusion, models


def _size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def format_collectives(coll, per_node):
    gpus = sorted({r["gpus"] for r in coll})
    lines = [f"One allreduce: sequential hops / predicted us ({per_node} GPUs a node, "
             f"{coll[0]['net_gbits']:g} Gb/s; nccl_*: NCCL's own tuning model, "
             "NVIDIA/nccl src/graph/tuning.cc)", "",
             "| size | algorithm | " + " | ".join(f"{g} GPUs" for g in gpus) + " |",
             "|---|---|" + "---:|" * len(gpus)]
    by = {(r["size"], r["algo"], r["gpus"]): r for r in coll}
    for size in sorted({r["size"] for r in coll if r["size"]}):
        for algo in list(ALGOS) + ["nccl_ring", "nccl_tree"]:
            cells = []
            for g in gpus:
                r = by[(size, algo, g)]
                h = "" if r["hops"] is None else f"{r['hops']} / "
                ran = f" ({r['ran']})" if algo == "auto" else ""
                cells.append(f"{h}{r['time_s'] * 1e6:.0f}{ran}")
            lines.append(f"| {_size(size)} | {algo} | " + " | ".join(cells) + " |")
    for vote in ("vote_ring", "vote_log", "vote_host"):
        cells = [f"{by[(0, vote, g)]['hops']} / {by[(0, vote, g)]['time_s'] * 1e6:.0f}"
                 for g in gpus]
        lines.append(f"| vote | {vote} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_report(p, sources, rows, fusion, models, args, coll=()):
    lines = ["### Scaling model: predicted step time and efficiency", ""]
    for k in ("alpha_coll", "alpha_step", "alpha_step_intra", "alpha_step_net",
              "alpha_tensor"):
        lines.append(f"- {k} = {p[k] * 1e6:.2f} us ({sources.get(k, 'default 0')})")
    for k in ("beta_shm", "beta_hop", "beta_intra"):
        if k in p:
            lines.append(f"- {k} = {p[k] / GB:.2f} GB/s ({sources.get(k)})")
    lines.append(f"- beta_net = {', '.join(f'{g:g}' for g in args.net_gbits)} Gb/s x "
                 f"{args.nics_per_node} NIC(s) per node (published: {PUBLISHED['net_gbits'][1]})")
    if "alphas" in sources:
        lines.append(f"- NOTE: {sources['alphas']}")
    lines.append(f"- {args.per_node} GPUs per node; fusion threshold "
                 f"{args.fusion_threshold >> 20} MiB, cycle time {args.cycle_time * 1e3:g} ms; "
                 "one agreement round per fused buffer")
    for f in models:
        if "compute_s" in f:
            lines.append(f"- {f['model']}: {f['tensors']} tensors, {f['bytes'] / 1e6:.1f} MB "
                         f"of gradients, compute {f['compute_s'] * 1e3:.1f} ms per step "
                         f"({f['compute_source']})")
    if coll:
        lines += ["", format_collectives(coll, args.per_node)]
    lines += ["", "Schemes: flat = today (ring allreduce, ring vote: N-1 hops); hier = "
              "hierarchical allreduce, ring vote; new = auto (recursive doubling up to "
              "32 KiB, hierarchical above) with the recursive-doubling vote.", "",
              "| model | net Gb/s | GPUs | flat step ms | flat eff | hier step ms | hier eff "
              "| new step ms | new eff | comm ms (new, unoverlapped) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["model"], r["net_gbits"], r["gpus"], r["algo"]): r for r in rows}
    for (model, gbit, gpus, algo), r in by.items():
        if algo != "flat":
            continue
        h, nw = by[(model, gbit, gpus, "hier")], by[(model, gbit, gpus, "new")]
        lines.append(f"| {model} | {gbit:g} | {gpus} | {r['step_s'] * 1e3:.1f} "
                     f"| {100 * r['efficiency']:.0f}% | {h['step_s'] * 1e3:.1f} "
                     f"| {100 * h['efficiency']:.0f}% | {nw['step_s'] * 1e3:.1f} "
                     f"| {100 * nw['efficiency']:.0f}% | {nw['comm_s'] * 1e3:.1f} |")
    eff, why = PUBLISHED["horovod_512_eff"]
    lines += ["", "At 512 GPUs, today's ring-only engine against the new algorithms:"]
    for r in rows:
        if r["gpus"] == 512 and r["algo"] == "new":
            old = by[(r["model"], r["net_gbits"], 512, "flat")]
            lines.append(f"- {r['model']}, {r['net_gbits']:g} Gb/s: step "
                         f"{old['step_s'] * 1e3:.1f} -> {r['step_s'] * 1e3:.1f} ms, efficiency "
                         f"{100 * old['efficiency']:.0f}% -> {100 * r['efficiency']:.0f}%; "
                         f"{100 * eff:.0f}% needs at least "
                         f"{r['compute_for_horovod_eff_s'] * 1e3:.1f} ms of compute per step "
                         f"(this run assumes {r['compute_s'] * 1e3:.1f} ms)")
    lines += [f"Reference: {why} ({100 * eff:.0f}%).", "",
              "Recommended fusion (minimum predicted exposed communication, "
              "new scheme, 64 GPUs):"]
    for f in fusion:
        if "fusion_threshold" in f:
            lines.append(f"- {f['model']}, {f['net_gbits']:g} Gb/s: TFRING_FUSION_THRESHOLD="
                         f"{f['fusion_threshold']} ({f['fusion_threshold'] >> 20} MiB), "
                         f"TFRING_CYCLE_TIME={f['cycle_time_s'] * 1e3:g} (ms); exposed "
                         f"{f['exposed_s'] * 1e3:.2f} ms")
    return "\n".join(lines)


def _model_ms(text):
    out = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=")
        if k not in MODELS:
            raise argparse.ArgumentTypeError(f"unknown model {k!r}; known: {', '.join(MODELS)}")
        out[k] = float(v)
    return out


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-json", help="allreduce_bench.py --json output")
    p.add_argument("--hops-json", help="hop_cost.py --json output: alpha per hop and per "
                   "collective, measured (takes precedence over --cpu-json's alphas)")
    p.add_argument("--gpu-json", action="append",
                   help="gpu_bench.py --json output (repeatable: the --mode mps one is "
                   "preferred; dry runs and emulation output are ignored)")
    p.add_argument("--json", help="write parameters and predictions here")
    p.add_argument("--per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--nics-per-node", type=int, default=1)
    p.add_argument("--net-gbits", type=lambda s: [float(x) for x in s.split(",")],
                   default=list(PUBLISHED["net_gbits"][0]),
                   help="network line rates to predict, Gb/s per NIC (default 25,100,200,400)")
    p.add_argument("--net-latency-us", type=float, default=0.0,
                   help="network latency added to every inter-node ring step")
    p.add_argument("--compute-ms", type=_model_ms, default={},
                   help="compute time per step, e.g. resnet50=120,bert-large=400")
    p.add_argument("--gpu-tflops", type=float, default=200.0,
                   help="sustained TFLOP/s for the derived compute time (default 200)")
    p.add_argument("--batch", type=_model_ms, default={"resnet50": 64, "bert-large": 32},
                   help="per-GPU batch for the derived compute time")
    p.add_argument("--vote-tensors", type=int, default=161,
                   help="cached tensors in the vote of the collective table (default 161, "
                   "ResNet-50's gradients; the step model uses each model's own)")
    p.add_argument("--fusion-threshold", type=int, default=64 << 20,
                   help="bytes (default 64 MiB, TFRING_FUSION_THRESHOLD)")
    p.add_argument("--cycle-time", type=float, default=2e-3,
                   help="seconds (default 0.002, TFRING_CYCLE_TIME)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.batch = {**{"resnet50": 64, "bert-large": 32}, **args.batch}
    p, sources = parameters(args)
    rows, fusion, models = predict(args, p)
    coll = collective_table(args, p)
    print(format_report(p, sources, rows, fusion, models, args, coll))
    if args.json:
        doc = {"benchmark": "scaling_model", "parameters": p, "sources": sources,
               "published": {k: {"value": v, "source": s} for k, (v, s) in PUBLISHED.items()},
               "models": models, "predictions": rows, "fusion": fusion,
               "collectives": coll}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(math.isfinite(r["step_s"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
