"""HDFSStore: a store on HDFS through pyarrow's HadoopFileSystem (libhdfs,
which needs the Hadoop client: HADOOP_HOME, JAVA_HOME and the CLASSPATH
that `hadoop classpath --glob` prints)."""

import os
import re

from tfring.spark.common.store import Store


class HDFSStore(Store):
    """Horovod's HDFSStore. ``prefix_path`` takes one of the forms

        hdfs://namenode01:8020/user/test/tfring
        hdfs:///user/test/tfring          (the default namenode)
        /user/test/tfring                 (hdfs:// is put before it)

    Spark reads and writes the full URLs; pyarrow gets the path without the
    scheme and host, and connects to ``host``/``port`` (from the arguments,
    else the URL, else 'default' and 0: fs.defaultFS of the Hadoop
    configuration). The connection opens on first use, in each process."""

    schemes = ("hdfs",)

    FS_PREFIX = "hdfs://"
    URL_PATTERN = r"^(?:(.+://))?(?:([^/:]+))?(?:[:]([0-9]+))?(?:(.+))?$"

    def __init__(self, prefix_path, host=None, port=None, user=None, kerb_ticket=None,
                 driver="libhdfs", extra_conf=None, *args, **kwargs):
        prefix_path = os.fspath(prefix_path)
        prefix, url_host, url_port, path, path_offset = self.parse_url(prefix_path)
        if prefix is not None and prefix != self.FS_PREFIX:
            raise ValueError(f"HDFSStore: {prefix_path!r} is not an hdfs:// URL "
                             f"(found {prefix!r})")
        if not path:
            raise ValueError(f"HDFSStore: no path in {prefix_path!r}")
        self._url_prefix = prefix_path[:path_offset] if prefix else self.FS_PREFIX
        self._hdfs_kwargs = dict(host=host or url_host or "default",
                                 port=int(port or url_port or 0), user=user,
                                 kerb_ticket=kerb_ticket, extra_conf=extra_conf)
        self.driver = driver  # pyarrow has one HDFS driver now (libhdfs)
        super().__init__(prefix_path, *args, **kwargs)

    def parse_url(self, url):
        """(scheme prefix, host, port, path, offset of the path in url)."""
        m = re.search(self.URL_PATTERN, url)
        port = m.group(3)
        return m.group(1), m.group(2), int(port) if port is not None else None, \
            m.group(4), m.start(4)

    @classmethod
    def matches(cls, path):
        return path.startswith(cls.FS_PREFIX)

    def get_full_path(self, path):
        path = os.fspath(path)
        return path if self.matches(path) else self._url_prefix + path

    def get_localized_path(self, path):
        path = os.fspath(path)
        if not self.matches(path):
            return path
        _, _, _, local, _ = self.parse_url(path)
        return local or "/"

    def _open_filesystem(self):
        import pyarrow.fs as pafs

        kw = {k: v for k, v in self._hdfs_kwargs.items() if v is not None}
        try:
            return pafs.HadoopFileSystem(**kw)
        except OSError as e:
            raise OSError(f"HDFSStore: cannot connect to HDFS ({kw.get('host')}:"
                          f"{kw.get('port')}): {e}. pyarrow needs the Hadoop client: set "
                          "HADOOP_HOME, JAVA_HOME and CLASSPATH=$(hadoop classpath --glob) "
                          "on the driver and the executors") from e
