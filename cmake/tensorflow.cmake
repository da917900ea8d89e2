# TensorFlow op library: built when TensorFlow is importable.
set(TFRING_HAVE_TF OFF)
