"""One rank of a job whose tfring core carries its own C++ runtime
(-static-libstdc++ -static-libgcc) in a process where the system
libstdc++.so.6 was loaded globally first, as CuPy, PyTorch or TensorFlow
do. The two runtimes must not mix: init and an allreduce work, checked
against a numpy float64 reference."""

import ctypes
ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)

import numpy as np  # noqa: E402
from common import report  # noqa: E402

import tfring.basics as basics  # noqa: E402
from tfring import _core  # noqa: E402

basics.init()
rank, n = basics.rank(), basics.size()
x = (np.arange(1000, dtype=np.float64) + 1) * (rank + 1)
y = _core.allreduce(x, op="sum", name="static_runtime")
want = (np.arange(1000, dtype=np.float64) + 1) * sum(r + 1 for r in range(n))
report({"core": _core.__file__, "ok": bool(np.allclose(y, want, rtol=1e-12, atol=0)),
        "max_error": float(np.max(np.abs(y - want)))})
basics.shutdown()
