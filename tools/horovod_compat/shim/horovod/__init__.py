"""A stand-in `horovod` package that maps Horovod's TensorFlow modules onto
tfring, so Horovod's own test files run unchanged against tfring
(tools/horovod_compat/run_horovod_tests.sh). Not part of tfring."""
