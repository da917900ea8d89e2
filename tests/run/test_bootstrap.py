"""How init() reads launchers' environments (tfring/_bootstrap.py)."""

import pytest

from tfring import _bootstrap, _core

LAUNCHER_VARS = ("TFRING_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MV2_")


@pytest.fixture
def clean_env(monkeypatch):
    import os
    for k in list(os.environ):
        if k.startswith(LAUNCHER_VARS):
            monkeypatch.delenv(k)
    return monkeypatch


def test_no_launcher_is_a_job_of_one(clean_env):
    assert _bootstrap.discover() == (0, 1, None, "")


def test_tfring_run_variables(clean_env):
    server = _core.TcpStoreServer("127.0.0.1", 0, "s3cret")
    try:
        clean_env.setenv("TFRING_RANK", "1")
        clean_env.setenv("TFRING_SIZE", "2")
        clean_env.setenv("TFRING_STORE_ADDR", f"127.0.0.1:{server.port}")
        clean_env.setenv("TFRING_SECRET", "s3cret")
        rank, size, store, secret = _bootstrap.discover()
        assert (rank, size, secret) == (1, 2, "s3cret")
        store.set("k", b"v")
        assert store.get("k", 5.0) == b"v"
    finally:
        server.stop()


def test_tfring_run_without_store_address_is_a_clear_error(clean_env):
    clean_env.setenv("TFRING_RANK", "0")
    clean_env.setenv("TFRING_SIZE", "2")
    with pytest.raises(RuntimeError, match="TFRING_STORE_ADDR"):
        _bootstrap.discover()


def test_bad_store_address(clean_env):
    clean_env.setenv("TFRING_RANK", "0")
    clean_env.setenv("TFRING_SIZE", "2")
    clean_env.setenv("TFRING_STORE_ADDR", "nohostport")
    with pytest.raises(ValueError, match="host:port"):
        _bootstrap.discover()


def test_mpi_size_one_needs_no_store(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "0")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "1")
    assert _bootstrap.discover()[:3] == (0, 1, None)


def test_mpich_without_mpi4py_falls_back_to_a_file_store(clean_env, tmp_path):
    clean_env.setenv("PMI_RANK", "1")
    clean_env.setenv("PMI_SIZE", "3")
    clean_env.setenv("TMPDIR", str(tmp_path))
    rank, size, store, secret = _bootstrap._via_fallback(1, 3, None)
    assert (rank, size) == (1, 3) and isinstance(store, _core.FileStore) and secret


@pytest.mark.parametrize("nodelist,first", [
    ("node1", "node1"), ("gpu[03-07,9]", "gpu03"), ("a[1,2],b[3-4]", "a1"), ("n1,n2", "n1")])
def test_slurm_first_host(clean_env, nodelist, first):
    clean_env.setenv("SLURM_JOB_NODELIST", nodelist)
    assert _bootstrap._first_slurm_host() == first
