"""LocalStore (local paths, file:// URLs) and FilesystemStore (any URL that
pyarrow.fs or an installed fsspec implementation opens: s3://, gs://,
abfs://, ...). The operations themselves are Store's (store.py)."""

import os
import re

from tfring.spark.common.store import Store, url_scheme

# Schemes pyarrow.fs opens itself, and the pyarrow module that must be built
# in for it.
_PYARROW_NATIVE = {"s3": "_s3fs", "s3a": "_s3fs", "s3n": "_s3fs", "gs": "_gcsfs",
                   "gcs": "_gcsfs", "abfs": "_azurefs", "abfss": "_azurefs",
                   "viewfs": "_hdfs"}
# The package that gives fsspec a scheme (for the error when neither
# pyarrow nor fsspec can open it).
_FSSPEC_PACKAGE = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs",
                   "abfs": "adlfs", "abfss": "adlfs", "az": "adlfs", "adl": "adlfs",
                   "oci": "ocifs", "oss": "ossfs", "hf": "huggingface_hub",
                   "dbfs": "fsspec", "webhdfs": "fsspec", "http": "fsspec aiohttp",
                   "https": "fsspec aiohttp", "sftp": "fsspec paramiko",
                   "gdrive": "gdrivefs", "dropbox": "dropboxdrivefs"}


class LocalStore(Store):
    """A store on a local (or mounted shared) file system. Every Spark
    executor must see the path under the same name: a shared mount (NFS,
    a cluster file system), or one host."""

    schemes = ("file",)

    def get_full_path(self, path):
        return "file://" + self._local(path)

    def get_localized_path(self, path):
        return self._local(path)

    @staticmethod
    def _local(path):
        path = os.fspath(path)
        if path.startswith("file://"):
            path = path[len("file://"):]
            if not path.startswith("/"):  # file://host/path: only the local host
                path = "/" + path.split("/", 1)[1] if "/" in path else "/"
        elif path.startswith("file:"):
            path = path[len("file:"):]
        return os.path.abspath(os.path.expanduser(path))

    def _open_filesystem(self):
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem()


class FilesystemStore(Store):
    """A store on any file system pyarrow.fs or fsspec opens, by URL.

    pyarrow's own filesystems serve s3:// (s3a:// and s3n:// too, the
    names Spark's Hadoop connector uses), gs://, abfs(s):// and viewfs://,
    with their usual credentials (environment, config files, instance
    metadata). ``storage_options`` (Horovod's) are fsspec's options, so
    giving them, or a scheme pyarrow lacks, uses the fsspec implementation
    (s3fs, gcsfs, adlfs, ...), which must be installed."""

    schemes = ("*",)

    def __init__(self, prefix_path, *args, storage_options=None, **kwargs):
        prefix_path = os.fspath(prefix_path)
        self.storage_options = dict(storage_options or {})
        self.protocol = url_scheme(prefix_path)
        self._backend = _choose_backend(prefix_path, self.protocol, self.storage_options)
        super().__init__(prefix_path, *args, **kwargs)

    def get_full_path(self, path):
        path = os.fspath(path)
        if url_scheme(path) == "file" and not path.startswith("file:"):
            if self.protocol == "file":
                return "file://" + LocalStore._local(path)
            raise ValueError(f"{type(self).__name__}: {path!r} is not a URL of this "
                             f"{self.protocol}:// store")
        return path

    def get_localized_path(self, path):
        path = os.fspath(path)
        if self.protocol == "file":
            return LocalStore._local(path)
        if self._backend == "fsspec":
            return self._fsspec_class()._strip_protocol(path)
        return _pyarrow_path(path)

    def _fsspec_class(self):
        import fsspec

        return fsspec.get_filesystem_class(self.protocol)

    def _open_filesystem(self):
        import pyarrow.fs as pafs

        if self.protocol == "file":
            return pafs.LocalFileSystem()
        if self._backend == "fsspec":
            cls = self._fsspec_class()
            options = dict(cls._get_kwargs_from_urls(self.prefix_path))
            options.update(self.storage_options)
            return pafs.PyFileSystem(pafs.FSSpecHandler(cls(**options)))
        uri = self.prefix_path
        if self.protocol in ("s3a", "s3n"):
            uri = "s3" + uri[len(self.protocol):]
        fs, _ = pafs.FileSystem.from_uri(uri)
        return fs


def _pyarrow_path(url):
    """A URL's path on the pyarrow filesystem of its scheme: bucket/key for
    s3 and gs, container/path for abfs (container@account), the path for
    viewfs."""
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://([^/]*)(.*)$", url)
    if not m:
        return url
    netloc, rest = m.group(1), m.group(2)
    scheme = url_scheme(url)
    if scheme == "viewfs":
        return rest or "/"
    if "@" in netloc:
        netloc = netloc.split("@", 1)[0]
    return (netloc + rest).rstrip("/") if rest != "/" else netloc


def _choose_backend(url, scheme, storage_options):
    """'pyarrow' or 'fsspec' for this URL, or a ValueError naming the scheme
    and what to install. Opens nothing (no network)."""
    if scheme == "file":
        return "pyarrow"
    native = _PYARROW_NATIVE.get(scheme)
    if native and not storage_options:
        try:
            __import__(f"pyarrow.{native}")
            return "pyarrow"
        except ImportError:
            pass
    package = _FSSPEC_PACKAGE.get(scheme)
    try:
        import fsspec
    except ImportError:
        hint = f"pip install {package}" if package else "install fsspec and its implementation " \
            f"for {scheme}://"
        raise ValueError(
            f"Store: no filesystem for {url!r}: pyarrow.fs does not open {scheme}:// "
            + ("with storage_options " if storage_options else "")
            + f"and fsspec is not installed ({hint})") from None
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:  # fsspec knows the scheme; its package is missing
        pkg = package or "the package fsspec names"
        raise ValueError(f"Store: no filesystem for {url!r}: {e} (pip install {pkg})") from None
    except ValueError as e:
        raise ValueError(f"Store: no filesystem for {url!r}: neither pyarrow.fs nor fsspec "
                         f"opens the scheme {scheme!r} ({e})") from None
    return "fsspec"
