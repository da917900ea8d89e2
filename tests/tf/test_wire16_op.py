"""Compression.fp16 / bf16 through the TensorFlow layer on 2 ranks
(tests/workers/wire16_tf.py): tfring.allreduce eager and in a tf.function,
grouped_allreduce over float32, float64 and int32, the gradient, the raw
RingAllreduce op's wire_dtype attribute, and Compression.fp16_cast (Horovod's
cast-then-sum) side by side."""

from multiproc import check_ok, run_ranks


def test_wire16_tf():
    # The job names the ring: on one host, auto serves a wire at float32
    # (csrc/collectives/allreduce_select.cc, linkWire).
    ranks = check_ok(run_ranks(2, "wire16_tf.py", timeout=180,
                               env={"TFRING_ALLREDUCE_ALGO": "ring"}))
    r0, r1 = ranks
    for key in ("eager", "function", "grouped"):
        assert r0[key]["digest"] == r1[key]["digest"], key  # identical on every rank
    e = r0["eager"]
    assert e["dtype"] == "float32" and e["emulated"], e
    assert e["in_ring"][0] < e["cast_then_sum"][0], e
    assert e["in_ring"][1] < e["cast_then_sum"][1], e
    assert r0["function"]["bf16"] and r0["function"]["avg_within"], r0["function"]
    g = r0["grouped"]
    assert g["dtypes"] == ["float32", "float64", "int32"], g
    assert g["f32"] and g["f64"] and g["int"] == [1, 14], g
    assert r0["grad"] and r1["grad"]
    assert r0["raw_op"] and r1["raw_op"]
    assert r0["compress"] == ["float16", "float32"], r0["compress"]
