"""The layer order of csrc/ (cmake/layers.py), and that the build enforces it.

common < rendezvous, kernels < transport < collectives < gpu < runtime <
tf, python: a layer's files include only their own layer's headers and
those of the layers below. The same script that the build runs before
compiling anything (target tfring_layers, cmake/layers.cmake) is checked
here on the real tree, on trees with upward includes planted in them, and,
when cmake and ninja are at hand, by configuring and building such a tree.
"""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CSRC = os.path.join(ROOT, "csrc")
SCRIPT = os.path.join(ROOT, "cmake", "layers.py")

_spec = importlib.util.spec_from_file_location("tfring_layers", SCRIPT)
layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)

ORDER = [name for name, _ in layers.LAYERS]


def run_check(root, *extra):
    return subprocess.run([sys.executable, SCRIPT, "--root", root, *extra],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def tree(tmp_path):
    """A copy of csrc/ to plant includes in."""
    dst = tmp_path / "csrc"
    shutil.copytree(CSRC, dst)
    return dst


def plant(path, include):
    """Appends `#include "include"` to `path`; returns its line number."""
    with open(path) as f:
        n = sum(1 for _ in f)
    with open(path, "a") as f:
        f.write('#include "%s"\n' % include)
    return n + 1


def test_order_covers_csrc_and_points_down():
    folders = sorted(e for e in os.listdir(CSRC) if os.path.isdir(os.path.join(CSRC, e)))
    assert sorted(ORDER) == folders
    assert ORDER.index("common") == 0
    assert ORDER[-2:] == ["tf", "python"]
    for i, (name, deps) in enumerate(layers.LAYERS):
        for dep in deps:
            assert dep in ORDER[:i], "%s builds on %s, which is not below it" % (name, dep)
    # The tops never use each other; every other layer may use all below it.
    tf_deps = dict(layers.LAYERS)["tf"]
    assert "python" not in tf_deps and "tf" not in dict(layers.LAYERS)["python"]
    assert set(tf_deps) == set(ORDER[:-2])


def test_source_tree_has_no_upward_include():
    assert layers.violations(CSRC) == []
    r = run_check(CSRC)
    assert r.returncode == 0, r.stderr


def test_every_include_in_the_tree_is_classified_by_the_rule():
    # Independent of the script: every "x/..." include of csrc/ whose first
    # component is a layer goes to that layer or one below the includer.
    rank = {name: i for i, name in enumerate(ORDER)}
    rank["python"] = rank["tf"]
    seen = 0
    for dirpath, _, files in os.walk(CSRC):
        layer = os.path.relpath(dirpath, CSRC).split(os.sep)[0]
        for name in files:
            with open(os.path.join(dirpath, name), errors="replace") as f:
                for line in f:
                    s = line.strip()
                    if not s.startswith('#include "'):
                        continue
                    first = s.split('"')[1].split("/")[0]
                    if first not in rank:
                        continue
                    seen += 1
                    assert rank[first] < rank[layer] or first == layer, (dirpath, name, s)
    assert seen > 300  # the walk saw the tree's includes


@pytest.mark.parametrize("src,include,upper", [
    ("gpu/device.h", "runtime/runtime.h", "runtime"),          # the GPU layer reaching up
    ("transport/channel.h", "collectives/allreduce.h", "collectives"),
    ("common/status.h", "tf/adapter.h", "tf"),
    ("kernels/cpu/copy.h", "transport/channel.h", "transport"),  # kernels sit below transport
    ("rendezvous/store.h", "kernels/cpu/copy.h", "kernels"),     # siblings: neither uses the other
    ("tf/adapter.h", "python/bindings.h", "python"),              # the tops do not use each other
    ("gpu/cuda/comm.h", "../../runtime/runtime.h", "runtime"),  # relative paths resolve first
])
def test_upward_include_is_refused(tree, src, include, upper):
    path = tree / src
    assert path.exists(), src
    line = plant(path, include)
    bad = layers.violations(str(tree))
    assert len(bad) == 1, bad
    assert bad[0].startswith("%s:%d:" % (path, line))
    assert "layer %s" % src.split("/")[0] in bad[0] and bad[0].endswith("not " + upper)
    stamp = tree.parent / "layers.ok"
    stamp.write_text("ok\n")  # from an earlier, clean run
    r = run_check(str(tree), "--stamp", str(stamp))
    assert r.returncode == 1
    assert "%s:%d:" % (path, line) in r.stderr and "1 include(s) break" in r.stderr
    assert not stamp.exists()  # so the build's check runs again, and fails again


def test_downward_and_local_includes_pass(tree):
    plant(tree / "runtime" / "engine.h", "gpu/executor.h")
    plant(tree / "gpu" / "cuda" / "device.cc", "comm.h")          # next to the file
    plant(tree / "python" / "bindings.h", "runtime/runtime.h")
    plant(tree / "tf" / "adapter.h", "tensorflow/core/framework/tensor.h")  # not ours
    stamp = tree.parent / "layers.ok"
    r = run_check(str(tree), "--stamp", str(stamp))
    assert r.returncode == 0, r.stderr
    assert stamp.read_text() == "ok\n"


def test_folder_outside_the_order_is_refused(tree):
    (tree / "extra").mkdir()
    (tree / "extra" / "x.h").write_text('#include "runtime/runtime.h"\n')
    bad = layers.violations(str(tree))
    assert len(bad) == 1 and "folder in no layer" in bad[0] and "extra" in bad[0]


def _tool(name):
    venv_bin = os.path.dirname(sys.executable)
    found = shutil.which(name, path=venv_bin + os.pathsep + os.environ.get("PATH", ""))
    return found


@pytest.mark.skipif(not (_tool("cmake") and _tool("ninja")), reason="needs cmake and ninja")
def test_build_fails_on_upward_include_before_compiling(tmp_path):
    """Configures a copy of the project (CPU only, no Python, no TF) and
    builds the GPU layer: with an upward include planted the build stops at
    the layer check, naming it, and no object was compiled."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(CSRC, src / "csrc")
    shutil.copytree(os.path.join(ROOT, "cmake"), src / "cmake")
    shutil.copy(os.path.join(ROOT, "CMakeLists.txt"), src / "CMakeLists.txt")
    build = tmp_path / "build"
    cfg = subprocess.run(
        [_tool("cmake"), "-S", str(src), "-B", str(build), "-G", "Ninja",
         "-DCMAKE_MAKE_PROGRAM=" + _tool("ninja"), "-DTFRING_WITH_CUDA=OFF",
         "-DTFRING_WITH_TF=OFF", "-DTFRING_BUILD_PYTHON=OFF",
         "-DPython_EXECUTABLE=" + sys.executable],
        capture_output=True, text=True, timeout=300)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr

    # Clean tree: the check passes.
    ok = subprocess.run([_tool("cmake"), "--build", str(build), "--target", "tfring_layers"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    header = src / "csrc" / "gpu" / "device.h"
    line = plant(header, "runtime/runtime.h")
    # The edit must look newer than the check's stamp to ninja. A file
    # system stamps times from a coarse clock (a jiffy, or worse), so an
    # edit right after the build can carry the stamp's own time and read
    # as unchanged: date it a second past the stamp, as a later edit is.
    stamp_ns = (build / "layers.ok").stat().st_mtime_ns
    later = max(header.stat().st_mtime_ns, stamp_ns + 1_000_000_000)
    os.utime(header, ns=(later, later))
    bad = subprocess.run([_tool("cmake"), "--build", str(build), "--target", "tfring_gpu"],
                         capture_output=True, text=True, timeout=300)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0, out
    assert "gpu/device.h:%d:" % line in out and "not runtime" in out, out
    objects = [f for _, _, fs in os.walk(build) for f in fs if f.endswith(".o")]
    assert objects == [], objects
