"""What the GPU tests share (tests/gpu/test_gpu.py, test_gpu_sets.py,
test_gpu_kernels.py, test_gpu_collectives.py): whether this process can
use a GPU (a real one, or the CUDA emulation build's), and the mark that
skips a test cleanly when it cannot."""

import pytest

from tfring import _core

HAVE_GPU = _core.cuda_available()
requires_gpu = pytest.mark.skipif(
    not HAVE_GPU, reason=f"no usable GPU: {_core.cuda_unavailable_reason()}")
