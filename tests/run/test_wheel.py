"""The binary wheel tools/build_wheel.sh builds: what it holds, and that it
trains 2 ranks once installed into a fresh venv with no compiler on PATH.

With TFRING_TEST_SLOW=1 (the build costs a full compile), the first case installs it into a venv that sees this environment's
TensorFlow through a .pth file (TensorFlow lives in another site-packages,
so the op library finds TensorFlow's libraries by soname); the slow case
(TFRING_TEST_SLOW=1) installs it into a bare venv where pip fetches its
TensorFlow, beside tfring, where the op library's run path points.

The wheel's CMake build dir (build/wheel-cp3XX) is kept between runs: the
first build compiles everything (minutes on 2 cores), later ones repackage."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from importlib import metadata

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
BUILD_S = 1200  # a first, full build; later ones take seconds
TRAIN_S = 180
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++")

pytest.importorskip("tensorflow")
# Building the wheel compiles the whole tree once more (minutes of CPU on 2
# cores): the suite runs it with TFRING_TEST_SLOW=1, as tools/build_wheel.sh
# users and the release job do.
pytestmark = pytest.mark.slow

# Trains y = x.w + b with Keras' fit and RingAllreduceCallback, one batch
# per rank per epoch, and saves each rank's weights.
TRAIN = r"""
import os, shutil, sys
assert not [c for c in {compilers!r} if shutil.which(c)], "a compiler is on PATH"
import numpy as np
import keras
import tfring
import tfring.keras as tk
assert tfring.__file__.startswith(sys.prefix), (tfring.__file__, sys.prefix)
tk.init()
rank, size = tfring.rank(), tfring.size()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.25).astype("float32")[:, None]
shard = slice(rank * 64 // size, (rank + 1) * 64 // size)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
    1, kernel_initializer=keras.initializers.Constant(0.1), bias_initializer="zeros")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
model.fit(x[shard], y[shard], batch_size=64 // size, epochs=6, shuffle=False, verbose=0,
          callbacks=[tk.callbacks.RingAllreduceCallback()])
w, b = model.get_weights()
np.save(os.path.join(sys.argv[1], f"rank{{rank}}.npy"), np.concatenate([w.ravel(), b]))
"""


def reference_weights():
    """Full-batch gradient descent on all 64 rows in float64: what averaging
    the two ranks' half-batch gradients must give."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32").astype(np.float64)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.25).astype("float32").astype(np.float64)
    w, b = np.full(4, 0.1), 0.0
    for _ in range(6):
        err = x @ w + b - y
        w, b = w - 0.05 * 2 * x.T @ err / 64, b - 0.05 * 2 * err.mean()
    return np.concatenate([w, [b]])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    r = subprocess.run(["bash", os.path.join(ROOT, "tools", "build_wheel.sh"), str(out)],
                       env=env, capture_output=True, text=True, timeout=BUILD_S)
    assert r.returncode == 0, r.stdout + r.stderr
    path = r.stdout.strip().splitlines()[-1]
    assert os.path.basename(path).endswith(f"-{TAG}-{TAG}-linux_x86_64.whl"), path
    return path


def test_the_wheel_holds_the_libraries_and_requires_its_tensorflow(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        tags = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    for lib in (f"tfring/_core{ext}", "tfring/libtfring_core.so", "tfring/_tfring_ops.so",
                "tfring/_tfring_ops.so.tfversion", "tfring/run/fn_job.py"):
        assert lib in names, lib
    assert not [n for n in names if "libtensorflow" in n], "TensorFlow's libraries bundled"
    assert f"Requires-Dist: tensorflow=={metadata.version('tensorflow')}" in meta
    assert f"Tag: {TAG}-{TAG}-linux_x86_64" in tags


def test_no_run_path_of_the_build_machine_is_in_the_wheel(wheel, tmp_path):
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf to read the run paths with")
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    want = {"_tfring_ops.so": ["$ORIGIN", "$ORIGIN/../tensorflow"], f"_core{ext}": ["$ORIGIN"],
            "libtfring_core.so": []}
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path, [f"tfring/{n}" for n in want])
    for name, paths in want.items():
        dyn = subprocess.check_output([readelf, "-d", str(tmp_path / "tfring" / name)],
                                      text=True)
        m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r\w*path: \[(.*)\]", dyn)
        assert (m.group(1).split(":") if m else []) == paths, (name, m and m.group(1))


def _venv(path, system_tf):
    venv.EnvBuilder(with_pip=not system_tf, clear=True).create(path)
    py = os.path.join(path, "bin", "python")
    site = subprocess.check_output(
        [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True).strip()
    if system_tf:
        # This environment's packages (TensorFlow and its dependencies), after
        # the venv's own, except the tfring installed here.
        shared = os.path.join(path, "shared")
        os.mkdir(shared)
        here = sysconfig.get_path("purelib")
        for name in os.listdir(here):
            if "tfring" not in name.lower():
                os.symlink(os.path.join(here, name), os.path.join(shared, name))
        with open(os.path.join(site, "shared-env.pth"), "w") as f:
            f.write(shared + "\n")
    return py, site


def _clean_env():
    """This environment without what would show another tfring (a source
    tree on PYTHONPATH has its egg-info) or set a job's variables."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CC", "CXX")
            and not k.startswith("TFRING_")}


def _train(py, tmp_path):
    bin_dir = os.path.dirname(py)
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(compilers=COMPILERS))
    out = tmp_path / "out"
    out.mkdir()
    env = _clean_env()
    env.update(PATH=bin_dir, VIRTUAL_ENV=os.path.dirname(bin_dir), TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([os.path.join(bin_dir, "tfring-run"), "-np", "2", "--timeout",
                        str(TRAIN_S - 20), py, str(script), str(out)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TRAIN_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = [np.load(out / f"rank{r}.npy") for r in range(2)]
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], reference_weights(), rtol=1e-5, atol=1e-6)


def test_the_wheel_trains_two_ranks_in_a_venv_without_a_compiler(wheel, tmp_path):
    py, site = _venv(str(tmp_path / "venv"), system_tf=True)
    # pip checks the wheel's requirements against what the venv sees (no index).
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q",
                    "--no-index", "--disable-pip-version-check", wheel],
                   check=True, timeout=120, env=_clean_env())
    assert os.path.exists(os.path.join(site, "tfring", "_tfring_ops.so"))
    _train(py, tmp_path)


@pytest.mark.slow
def test_the_wheel_installs_with_its_tensorflow_into_a_bare_venv(wheel, tmp_path):
    py, site = _venv(str(tmp_path / "venv"), system_tf=False)
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel],
                   check=True, timeout=900, env=_clean_env())
    # The op library finds TensorFlow's libraries through its run path alone
    # (TensorFlow not imported yet), in the tensorflow package beside it.
    subprocess.run([py, "-c", "import ctypes, os, tfring; ctypes.CDLL(os.path.join("
                    "os.path.dirname(tfring.__file__), '_tfring_ops.so'))"],
                   check=True, timeout=60, env={"PATH": os.path.dirname(py)})
    _train(py, tmp_path)
