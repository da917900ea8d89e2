"""tfring: data-parallel TensorFlow training with a ring allreduce."""
