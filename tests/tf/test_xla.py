"""tfring's collectives inside tf.function(jit_compile=True) on 1 and 2
ranks (worker: tests/workers/xla.py): every supported op bit-equal to numpy
and to the same function without XLA, a collective in a while loop, the
same MismatchError as without XLA on every rank, a DistributedGradientTape
training step and a Keras fit with jit_compile=True reaching the non-XLA
weights, and the errors for what XLA
cannot run (ragged allgather, dynamic shapes, a late import).

TFRING_TEST_XLA_GPU=1 (tools/gpu_tf_stage.sh run sets it on a GPU
machine) runs the same checks with the GPU visible: TensorFlow places the
steps on GPU:0, XLA compiles them for the GPU and the collectives run as
tfring's "CUDA" custom-call target, both ranks sharing the one GPU (MPS).
Then every rank must report a GPU, so the checks cannot pass on the CPU
by accident."""

import importlib.util
import os

import pytest

from multiproc import rank_results, run_ranks

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GPU = os.environ.get("TFRING_TEST_XLA_GPU") == "1"
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TFRING_TIMEOUT": "60"}
if GPU:
    ENV["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"  # ranks share the GPU
else:
    ENV["CUDA_VISIBLE_DEVICES"] = ""
CHECKS = ["placement", "ops_match_numpy_and_no_xla", "while_loop",
          "mismatch_same_error_as_without_xla",
          "allgather_needs_equal_rows_under_xla", "dynamic_shape_names_the_op",
          "tape_training_matches_no_xla", "keras_fit_jit_matches_no_xla",
          "gradients_match_no_xla", "calls_chained_where_they_block",
          "free_calls_run_in_any_order", "outputs_written_over_inputs"]


def _xla_built():
    # The package imported (a checkout's tfring/, or a build's package
    # directory on PYTHONPATH), not necessarily this checkout's.
    spec = importlib.util.find_spec("tfring")
    pkg = os.path.dirname(spec.origin) if spec else os.path.join(os.path.dirname(TESTS), "tfring")
    state = os.path.join(pkg, "_tfring_ops.so.xla")
    try:
        with open(state) as f:
            return f.read().startswith("on")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _xla_built(),
                                reason="tfring's op library was built without XLA kernels")

_jobs = {}


def job(size, order=None):
    if (size, order) not in _jobs:
        env = dict(ENV, TFRING_XLA_ORDER=order) if order else ENV
        _jobs[(size, order)] = run_ranks(size, "xla.py", ["main"], env=env, timeout=300)
    return _jobs[(size, order)]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("size", [1, 2])
def test_check(size, check):
    if check == "mismatch_same_error_as_without_xla" and size == 1:
        pytest.skip("a mismatch needs two ranks")
    outs = rank_results(job(size), check)
    failed = [(r, o.get("error")) for r, o in enumerate(outs) if not o["ok"]]
    assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)


def test_every_check_passes_with_the_calls_chained():
    """TFRING_XLA_ORDER=chain on the CPU: the chain the CUDA target always
    gets (each call blocks there, so XLA's per-rank schedule must not
    reorder them) changes no result, and the calls form one chain."""
    results = job(2, "chain")
    failed = [(r, c, o.get("error")) for c in CHECKS
              for r, o in enumerate(rank_results(results, c)) if not o["ok"]]
    assert not failed, "\n".join(f"rank {r} {c}:\n{e}" for r, c, e in failed)
    step = rank_results(results, "calls_chained_where_they_block")
    assert all(o["chained"] for o in step)
    # Every rank chains the step's calls in one order.
    chains = [o["chain"] for o in step]
    assert all(c == chains[0] for c in chains), chains


@pytest.mark.parametrize("size", [1, 2])
def test_runs_where_asked(size):
    """Without TFRING_TEST_XLA_GPU every rank runs on the CPU; with it, every
    rank sees a GPU and its XLA step's collective output lives there."""
    for r, out in enumerate(rank_results(job(size), "placement")):
        assert out["ok"], out.get("error")
        if GPU:
            assert out["gpus"] and "GPU" in out["device"], (r, out)
        else:
            assert not out["gpus"] and "CPU" in out["device"], (r, out)


@pytest.mark.parametrize("size", [1, 2])
def test_names_agree_across_ranks(size):
    names = [o["names"] for o in rank_results(job(size), "ops_match_numpy_and_no_xla")]
    assert all(n == names[0] for n in names), names
    assert len(set(names[0])) == len(names[0]), names[0]


def test_mismatch_message_is_the_same_with_and_without_xla():
    for out in rank_results(job(2), "mismatch_same_error_as_without_xla"):
        msgs = out["messages"]
        # TF wraps the engine's message: "[Op:...]" after it under XLA; the
        # graph executor's "Graph execution error", node and stack around it.
        for kind, name in (("", "bad/bad_shape"), ("group ", "bad_group/bad_group")):
            core = msgs[kind + "xla"].split(" [Op:")[0]
            assert core.startswith(f"mismatched allreduce of tensor '{name}'"), msgs
            assert core in msgs[kind + "graph"], msgs


def test_import_after_an_xla_compilation_fails_at_trace_time():
    outs = rank_results(run_ranks(1, "xla.py", ["late_import"], env=ENV, timeout=120),
                        "late_import")
    assert outs[0]["ok"], outs[0].get("error")


def test_benchmark_reports_both_steps(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    env = dict(os.environ, **ENV)
    r = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(TESTS), "benchmarks", "xla_bench.py"),
         "--reps", "1", "--iters", "2", "--width", "16", "--layers", "1", "--batch", "8",
         "--features", "8", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "XLA/no XLA" in r.stdout and "target XLA/no XLA <= 1.10" in r.stdout, r.stdout
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 2 and set(doc["steps"]) == {"mlp", "fused"}, doc
    for step in doc["steps"].values():
        for key in ("xla_s", "no_xla_s", "alone_xla_s", "alone_no_xla_s"):
            assert step[key] > 0, (key, step)


@pytest.mark.parametrize("size", [1, 2])
def test_ranks_exit_cleanly(size):
    for r in job(size):
        assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}\n{r.stderr[-3000:]}"
