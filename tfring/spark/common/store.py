"""Store: where the Keras estimator keeps its intermediate Parquet data and
its runs (checkpoints, TensorBoard logs), with Horovod's
horovod.spark.common.store API.

    store = Store.create("/shared/tfring")          # LocalStore
    store = Store.create("hdfs://nn:8020/user/me")  # HDFSStore
    store = Store.create("s3://bucket/prefix")      # FilesystemStore

Layout under the prefix (Horovod's):

    intermediate_train_data[.<idx>]/   Parquet files written by fit()
    intermediate_train_data[.<idx>].metadata.json   rows, files, columns
    intermediate_val_data[.<idx>]/     the validation split
    runs/<run_id>/checkpoint.keras     the newest checkpoint of the run
    runs/<run_id>/logs/                TensorBoard logs

Every path a getter returns is a full URL (file:///..., hdfs://..., s3://...)
that Spark can write to. ``store.filesystem`` is a pyarrow filesystem for
the same files; ``store.get_localized_path(url)`` is the path to give it.
The store is pickled to the Spark tasks without its filesystem, which each
process opens again on first use.

Files appear complete or not at all: ``write_bytes`` and ``upload`` write
a hidden temporary name beside the target (``.<name>.tmp-<hex>``) and move
it into place, an atomic rename on local disks and HDFS; object stores
(S3, GCS) publish an object only once it is fully written.

The concrete stores live in their own modules (fs_store.py, hdfs_store.py)
and are re-exported here.
"""

import contextlib
import os
import posixpath
import re
import secrets
import shutil
import tempfile

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
TMP_MARK = ".tmp-"


def url_scheme(path):
    """The scheme of a URL ('s3' for s3://b/k), 'file' for file:/... and
    plain paths."""
    m = _SCHEME.match(path)
    if m:
        return m.group(1).lower()
    return "file"


class Store:
    """Storage for intermediate data and training artifacts. Subclasses give
    the filesystem (``_open_filesystem``) and how a URL maps to its paths
    (``get_full_path``, ``get_localized_path``); every operation below is
    written once against pyarrow.fs."""

    def __init__(self, prefix_path, train_path=None, val_path=None, test_path=None,
                 runs_path=None, save_runs=True, checkpoint_filename=None):
        self.prefix_path = self.get_full_path(prefix_path).rstrip("/")
        self._train_path = self._full_or_default(train_path, "intermediate_train_data")
        self._val_path = self._full_or_default(val_path, "intermediate_val_data")
        self._test_path = self._full_or_default(test_path, "intermediate_test_data")
        self._runs_path = self._full_or_default(runs_path, "runs")
        self._save_runs = bool(save_runs)
        self.checkpoint_filename = checkpoint_filename or "checkpoint.keras"
        self._filesystem = None

    @staticmethod
    def create(prefix_path, *args, **kwargs):
        """The store for ``prefix_path``: LocalStore for a local path or
        file:// URL, HDFSStore for hdfs://, otherwise FilesystemStore (any
        scheme pyarrow.fs or an installed fsspec implementation opens; an
        unknown one is an error naming the package to install)."""
        # The subclasses register their schemes as they are defined
        # (__init_subclass__); the package's __init__ imports them all.
        prefix_path = os.fspath(prefix_path)
        scheme = url_scheme(prefix_path)
        cls = Store._by_scheme.get(scheme) or Store._by_scheme["*"]
        return cls(prefix_path, *args, **kwargs)

    _by_scheme = {}
    schemes = ()  # URL schemes a subclass serves; "*" for any other

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for scheme in cls.__dict__.get("schemes", ()):
            Store._by_scheme[scheme] = cls

    # --- what a subclass gives --------------------------------------------

    def get_full_path(self, path):
        """``path`` as a URL of this store (a relative or absolute local path,
        or a URL already)."""
        raise NotImplementedError

    def get_localized_path(self, path):
        """The path of a URL of this store on ``self.filesystem``."""
        raise NotImplementedError

    def _open_filesystem(self):
        raise NotImplementedError

    @property
    def filesystem(self):
        """A pyarrow.fs.FileSystem for this store's files (opened on first
        use, in every process)."""
        if self._filesystem is None:
            self._filesystem = self._open_filesystem()
        return self._filesystem

    @property
    def fs(self):
        """Horovod's name for ``filesystem``."""
        return self.filesystem

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_filesystem"] = None  # reopened where the store is unpickled
        return state

    # --- Horovod's path getters -------------------------------------------

    def _full_or_default(self, path, default_name):
        if path is not None:
            return self.get_full_path(os.fspath(path)).rstrip("/")
        return self.prefix_path + "/" + default_name

    def get_train_data_path(self, idx=None):
        return self._train_path if idx is None else f"{self._train_path}.{idx}"

    def get_val_data_path(self, idx=None):
        return self._val_path if idx is None else f"{self._val_path}.{idx}"

    def get_test_data_path(self, idx=None):
        return self._test_path if idx is None else f"{self._test_path}.{idx}"

    def get_data_metadata_path(self, path):
        """Where prepare writes the row counts, files and column metadata of
        the Parquet data set at ``path``."""
        return path.rstrip("/") + ".metadata.json"

    def saving_runs(self):
        return self._save_runs

    def get_runs_path(self):
        return self._runs_path

    def get_run_path(self, run_id):
        return f"{self._runs_path}/{run_id}"

    def get_checkpoint_path(self, run_id):
        """The folder of the run's checkpoint (None with save_runs=False)."""
        return self.get_run_path(run_id) if self._save_runs else None

    def get_checkpoint_filename(self):
        return self.checkpoint_filename

    def get_logs_subdir(self):
        return "logs"

    def get_logs_path(self, run_id):
        return f"{self.get_run_path(run_id)}/logs" if self._save_runs else None

    def get_checkpoints(self, run_id, suffix=".keras"):
        """The complete checkpoint files of the run (URLs), sorted."""
        path = self.get_checkpoint_path(run_id)
        if path is None:
            return []
        return [f for f in self.list_files(path)
                if f.endswith(suffix) and TMP_MARK not in posixpath.basename(f)]

    # --- file operations ---------------------------------------------------

    def _info(self, path):
        return self.filesystem.get_file_info(self.get_localized_path(path))

    def exists(self, path):
        import pyarrow.fs as pafs

        return self._info(path).type != pafs.FileType.NotFound

    def is_dir(self, path):
        import pyarrow.fs as pafs

        return self._info(path).type == pafs.FileType.Directory

    def read(self, path):
        """The file's contents as bytes."""
        with self.filesystem.open_input_stream(self.get_localized_path(path)) as f:
            return f.read()

    def write_text(self, path, text):
        """Writes ``text`` (UTF-8) to ``path``, atomically."""
        self.write_bytes(path, text.encode("utf-8"))

    def write_bytes(self, path, data):
        """Writes ``data`` to a temporary name beside ``path`` and moves it
        into place, so readers see the old file or the whole new one."""
        tmp = self._temp_name(path)
        self._make_parent(path)
        try:
            with self.filesystem.open_output_stream(self.get_localized_path(tmp)) as f:
                f.write(data)
            self._move_into_place(tmp, path)
        except BaseException:
            self._remove_quietly(tmp)
            raise

    def upload(self, local_path, path):
        """Copies a local file to ``path`` in the store, atomically."""
        tmp = self._temp_name(path)
        self._make_parent(path)
        try:
            with open(local_path, "rb") as src, \
                    self.filesystem.open_output_stream(self.get_localized_path(tmp)) as dst:
                shutil.copyfileobj(src, dst, 4 << 20)
            self._move_into_place(tmp, path)
        except BaseException:
            self._remove_quietly(tmp)
            raise

    def delete(self, path):
        """Removes a file or a folder (recursively); nothing if absent."""
        import pyarrow.fs as pafs

        info = self._info(path)
        local = self.get_localized_path(path)
        if info.type == pafs.FileType.Directory:
            self.filesystem.delete_dir(local)
        elif info.type != pafs.FileType.NotFound:
            self.filesystem.delete_file(local)

    def list_files(self, path, recursive=False):
        """URLs of the files under the folder ``path`` (none if absent),
        sorted by name."""
        import pyarrow.fs as pafs

        base = self.get_localized_path(path).rstrip("/")
        selector = pafs.FileSelector(base, allow_not_found=True, recursive=recursive)
        infos = self.filesystem.get_file_info(selector)
        root = path.rstrip("/")
        out = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            rel = info.path[len(base):].lstrip("/") if info.path.startswith(base) \
                else posixpath.basename(info.path)
            out.append(f"{root}/{rel}")
        return sorted(out)

    def remove_temporary_files(self, path):
        """Deletes the temporary files a writer that died left under
        ``path`` (recursively). Returns how many."""
        n = 0
        for f in self.list_files(path, recursive=True):
            if TMP_MARK in posixpath.basename(f):
                self._remove_quietly(f)
                n += 1
        return n

    # --- Parquet -------------------------------------------------------------

    def get_parquet_files(self, path):
        """URLs of the Parquet files of the data set at ``path``, sorted by
        name, without Spark's marker and checksum files."""
        return [f for f in self.list_files(path)
                if f.endswith(".parquet") and not posixpath.basename(f).startswith(("_", "."))]

    def is_parquet_dataset(self, path):
        try:
            return bool(self.get_parquet_files(path))
        except (OSError, ValueError):
            return False

    def get_parquet_dataset(self, path):
        """A pyarrow.parquet.ParquetDataset of the data set at ``path``."""
        import pyarrow.parquet as pq

        files = [self.get_localized_path(f) for f in self.get_parquet_files(path)]
        if not files:
            raise FileNotFoundError(f"no Parquet files under {path}")
        return pq.ParquetDataset(files, filesystem=self.filesystem)

    # --- run outputs (Horovod's remote-store functions) ------------------------

    def get_local_output_dir_fn(self, run_id):
        """A context manager factory: a local folder rank 0 writes its run
        output into (checkpoints, logs), removed afterwards; ``sync_fn``
        copies it into the store."""

        @contextlib.contextmanager
        def local_run_path():
            with tempfile.TemporaryDirectory(prefix=f"tfring-run-{run_id}-") as tmp:
                yield tmp

        return local_run_path

    def sync_fn(self, run_id):
        """A function copying a local run folder into the run's path in the
        store, each file that changed since its last call (atomically)."""
        run_path = self.get_run_path(run_id)
        seen = {}

        def sync(local_run_path):
            for dirpath, _, files in os.walk(local_run_path):
                for name in files:
                    local = os.path.join(dirpath, name)
                    st = os.stat(local)
                    stamp = (st.st_mtime_ns, st.st_size)
                    if seen.get(local) == stamp:
                        continue
                    rel = os.path.relpath(local, local_run_path).replace(os.sep, "/")
                    self.upload(local, f"{run_path}/{rel}")
                    seen[local] = stamp

        return sync

    # --- helpers ---------------------------------------------------------------

    def _temp_name(self, path):
        head, name = path.rstrip("/").rsplit("/", 1)
        return f"{head}/.{name}{TMP_MARK}{secrets.token_hex(6)}"

    def _make_parent(self, path):
        parent = self.get_localized_path(path).rstrip("/").rsplit("/", 1)[0]
        if parent:
            self.filesystem.create_dir(parent, recursive=True)

    def _move_into_place(self, tmp, path):
        src, dst = self.get_localized_path(tmp), self.get_localized_path(path)
        try:
            self.filesystem.move(src, dst)
        except OSError:
            # HDFS renames onto an existing file fail: replace it.
            if not self.exists(path):
                raise
            self.filesystem.delete_file(dst)
            self.filesystem.move(src, dst)

    def _remove_quietly(self, path):
        try:
            self.filesystem.delete_file(self.get_localized_path(path))
        except (OSError, FileNotFoundError):
            pass

    def __repr__(self):
        return f"{type(self).__name__}({self.prefix_path!r})"


_CONCRETE = {"LocalStore": "fs_store", "FilesystemStore": "fs_store",
             "HDFSStore": "hdfs_store"}


def __getattr__(name):
    # `from tfring.spark.common.store import LocalStore` as with Horovod; the
    # classes live in their own modules, which import this one.
    if name in _CONCRETE:
        import importlib

        return getattr(importlib.import_module(f"tfring.spark.common.{_CONCRETE[name]}"),
                       name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
