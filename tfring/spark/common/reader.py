"""Each rank streams its own Parquet files into training batches.

The files of a data set are sorted by name and dealt to ranks in turn:
rank r of n reads files r, r+n, r+2n, ... (its shard). Shards are disjoint
and together hold every row.

One epoch is one fresh pass over the shard, cut after the agreed number of
steps. Every rank must run the same number of steps (each step's gradient
allreduce waits for every rank), so the ranks agree, with an allreduce,
on the smallest shard's count of whole batches (``agreed_steps``). A pass
then:

  1. orders the shard's files: name order, or with shuffling a permutation
     drawn from (seed, epoch, rank), and likewise the row groups of each
     file;
  2. streams each file's record batches (pyarrow ``ParquetFile.iter_batches``,
     a few MiB each), converts the columns to numpy (arrays and vectors to
     (rows, *shape) arrays; the BINARY tensor columns that prepare writes,
     tensor_codec.py, by one np.frombuffer each) and applies ``transformation_fn`` to each one
     (a pandas DataFrame in, one out, as Horovod's);
  3. with shuffling, mixes rows in a buffer of ``buffer_rows`` rows: once
     it is full, each row read takes the place of a random buffer row,
     which goes on;
  4. cuts whole batches of ``batch_size`` rows, in order, and stops after
     the agreed steps.

The remainder rule: rows after the last whole agreed step of a pass are
not seen in that epoch (a rank holding more rows than the smallest shard
leaves the difference, plus the partial last batch). Without shuffling it
is the same rows at the end of the shard every epoch; with shuffling the
file order and the buffer change every epoch, and so does the remainder.
A pass that runs short of the agreed steps (``train_steps_per_epoch``
larger than the shard, or a transformation_fn that drops rows) goes on
with a fresh pass of the next pass index, so an epoch always has exactly
the agreed steps.

Memory stays bounded while streaming: the record batch being converted,
the shuffle buffer, one batch being assembled, and tf.data's prefetch.
``inmemory_cache_all=True`` instead reads the shard once (after
transformation_fn) and keeps it, shuffling all of it each epoch.
"""

import numpy as np

from tfring.spark.common import tensor_codec

_TARGET_CHUNK_BYTES = 8 << 20
_DEFAULT_BUFFER_BYTES = 64 << 20


def shard_files(files, rank, size):
    """The files (sorted by name) that ``rank`` of ``size`` reads."""
    if len(files) < size:
        raise ValueError(f"{len(files)} Parquet files for {size} ranks: a rank would get no "
                         "data; write at least one file per rank")
    return sorted(files)[rank::size]


def agreed_steps(mine, name):
    """The smallest of every rank's ``mine`` (tfring must be initialized)."""
    from tfring import _core, basics

    if not basics.is_initialized() or basics.size() == 1:
        return int(mine)
    got = _core.allreduce(np.array([int(mine)], np.int64), name=name, op="min")
    return int(np.asarray(got)[0])


def _is_list(t):
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def arrow_to_numpy(arr, col, shape=None):
    """A column of a record batch as a (rows, *per-row shape) numpy array.
    Nulls, and arrays whose rows differ in length, are errors naming the
    column; ``shape`` (when given) is checked."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    n = len(arr)
    vals, dims = arr, []
    while True:
        if vals.null_count:
            raise ValueError(f"column {col!r} holds {vals.null_count} null value(s): the "
                             "model needs a value in every row (filter or fill them first)")
        if not _is_list(vals.type):
            break
        if pa.types.is_fixed_size_list(vals.type):
            width = vals.type.list_size
        else:
            lengths = pc.min_max(pc.list_value_length(vals)).as_py()
            lo, hi = lengths["min"], lengths["max"]
            if lo != hi:
                raise ValueError(f"column {col!r}: its rows hold between {lo} and {hi} values "
                                 f"(at depth {len(dims) + 1}); a model input needs the same "
                                 "shape in every row")
            width = lo or 0
        dims.append(width)
        vals = vals.flatten()
    out = vals.to_numpy(zero_copy_only=False).reshape((n, *dims))
    return _check_shape(out, col, shape)


def column_to_numpy(arr, col, shape=None, dtype=None):
    """A record batch's column as numpy: a BINARY tensor column
    (tensor_codec.py) through ``dtype`` and ``shape``, any other through
    arrow_to_numpy."""
    if tensor_codec.is_binary(arr.type):
        if dtype is None or shape is None:
            raise ValueError(f"column {col!r} holds byte strings, not numbers, and no "
                             "metadata says which tensors they encode")
        return tensor_codec.decode(arr, col, dtype, shape)
    return arrow_to_numpy(arr, col, shape)


def _pandas_with_tensors(batch, dtypes, shapes):
    """batch.to_pandas(), with BINARY tensor columns as a column of per-row
    arrays (as to_pandas gives a list column): what transformation_fn sees
    does not depend on how the data was stored."""
    encoded = [f.name for f in batch.schema if tensor_codec.is_binary(f.type)
               and f.name in dtypes]
    pdf = batch.drop_columns(encoded).to_pandas() if encoded else batch.to_pandas()
    for c in encoded:
        rows = column_to_numpy(batch.column(c), c, shapes.get(c), dtypes[c])
        values = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            values[i] = row
        pdf.insert(batch.schema.get_field_index(c), c, values)
    return pdf


def _check_shape(out, col, shape):
    if shape is None or tuple(out.shape[1:]) == tuple(shape):
        return out
    if int(np.prod(out.shape[1:])) != int(np.prod(shape)):
        raise ValueError(f"column {col!r}: rows of shape {tuple(out.shape[1:])}, expected "
                         f"{tuple(shape)}")
    return out.reshape((out.shape[0], *shape))


def pandas_to_numpy(series, col, shape=None):
    """A pandas column (after transformation_fn) as a numpy array."""
    values = series.to_numpy()
    if values.dtype == object:
        if len(values) and values[0] is None:
            raise ValueError(f"column {col!r} holds null values after transformation_fn")
        values = np.stack([np.asarray(v) for v in values]) if len(values) else values
    return _check_shape(values, col, shape)


def _concat(chunks):
    if len(chunks) == 1:
        return chunks[0]
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def _take(chunk, idx):
    return {k: v[idx] for k, v in chunk.items()}


def _rows(chunk):
    return len(next(iter(chunk.values()))) if chunk else 0


class ShardReader:
    """Batches of one rank's Parquet files, as dicts column -> numpy array.

    filesystem: a pyarrow filesystem; files: this rank's files on it;
    columns: column -> per-row shape (a list, or None to take each column
    as it comes); buffer_rows: shuffle buffer size in rows (0: no
    shuffling; None: about 64 MiB of rows); seed, rank: seed the shuffles
    (with the epoch and the pass); dtypes: column -> element dtype, which
    the BINARY tensor columns (tensor_codec.py) need."""

    def __init__(self, filesystem, files, columns, batch_size, shuffle=False, buffer_rows=None,
                 seed=0, rank=0, inmemory_cache_all=False, transformation_fn=None,
                 read_rows=None, dtypes=None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.filesystem = filesystem
        self.files = list(files)
        self.columns = dict(columns)
        self.dtypes = dict(dtypes or {})
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle) and buffer_rows != 0
        self.seed = int(seed or 0)
        self.rank = int(rank)
        self.inmemory_cache_all = bool(inmemory_cache_all)
        self.transformation_fn = transformation_fn
        self._cache = None
        self._rows, row_bytes = self._footers()
        self.read_rows = int(read_rows or min(65536, max(64, _TARGET_CHUNK_BYTES // row_bytes)))
        if buffer_rows is None:
            buffer_rows = max(self.batch_size, _DEFAULT_BUFFER_BYTES // row_bytes)
        self.buffer_rows = int(min(buffer_rows, max(self._rows, 1))) if self.shuffle else 0

    def _open(self, path):
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.filesystem.open_input_file(path))

    def _footers(self):
        rows = nbytes = 0
        for f in self.files:
            md = self._open(f).metadata
            rows += md.num_rows
            nbytes += sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        return rows, max(1, nbytes // max(rows, 1))

    def num_rows(self):
        """Rows in this shard (from the Parquet footers)."""
        return self._rows

    def steps_per_pass(self):
        """Whole batches in one pass over the shard."""
        return self._rows // self.batch_size

    def _rng(self, epoch, pass_idx, what):
        return np.random.default_rng([self.seed, int(epoch), self.rank, int(pass_idx), what])

    def _chunks(self, epoch, pass_idx):
        """One pass's record batches as numpy dicts, in file (and row
        group) order, shuffled per (epoch, pass) when shuffling."""
        files = list(self.files)
        if self.shuffle:
            files = [files[i] for i in self._rng(epoch, pass_idx, 0).permutation(len(files))]
        read_cols = None if self.transformation_fn is not None else list(self.columns)
        for i, path in enumerate(files):
            pf = self._open(path)
            groups = list(range(pf.metadata.num_row_groups))
            if self.shuffle and len(groups) > 1:
                groups = [groups[j] for j in
                          self._rng(epoch, pass_idx, 1 + i).permutation(len(groups))]
            if not groups:
                continue
            for batch in pf.iter_batches(batch_size=self.read_rows, row_groups=groups,
                                         columns=read_cols, use_threads=False):
                if batch.num_rows:
                    yield self._convert(batch)

    def _convert(self, batch):
        if self.transformation_fn is None:
            return {c: column_to_numpy(batch.column(c), c, shape, self.dtypes.get(c))
                    for c, shape in self.columns.items()}
        out = self.transformation_fn(_pandas_with_tensors(batch, self.dtypes, self.columns))
        if out is None:
            raise ValueError("transformation_fn returned None: it must return the "
                             "(transformed) pandas DataFrame")
        missing = [c for c in self.columns if c not in out.columns]
        if missing:
            raise ValueError(f"transformation_fn's result lacks column(s) {missing}")
        return {c: pandas_to_numpy(out[c], c, shape) for c, shape in self.columns.items()}

    def _shuffled(self, chunks, epoch, pass_idx):
        """Rows through the shuffle buffer (module docstring, step 3).

        The buffer is ``buffer_rows`` preallocated rows. Once it is full,
        each row read takes the slot of a buffer row drawn at random
        (without replacement within a chunk), and that row goes on: every
        byte read is copied twice (into the buffer, out of it), whatever
        the buffer's size. At the end of the pass the rows still held go
        on in a random order."""
        rng = self._rng(epoch, pass_idx, 2)
        cap = self.buffer_rows
        buf, filled = None, 0
        for chunk in chunks:
            n = _rows(chunk)
            if buf is None:
                buf = {k: np.empty((cap,) + v.shape[1:], v.dtype) for k, v in chunk.items()}
            for k, v in chunk.items():
                if v.dtype != buf[k].dtype:
                    buf[k] = buf[k].astype(np.result_type(buf[k].dtype, v.dtype))
            start = min(cap - filled, n)
            if start:
                for k, v in chunk.items():
                    buf[k][filled:filled + start] = v[:start]
                filled += start
            while start < n:
                m = min(n - start, cap)
                slots = rng.choice(cap, m, replace=False) if m < cap else rng.permutation(cap)
                yield _take(buf, slots)
                for k, v in chunk.items():
                    buf[k][slots] = v[start:start + m]
                start += m
        if filled:
            order = rng.permutation(filled)
            yield _take(buf, order)  # order: a permutation of the filled rows

    def _load_cache(self):
        if self._cache is None:
            chunks = list(self._chunks(0, 0)) if self.files else []
            self._cache = _concat(chunks) if chunks else {}
        return self._cache

    def _pass_batches(self, epoch, pass_idx):
        b = self.batch_size
        if self.inmemory_cache_all:
            data = self._load_cache()
            n = _rows(data)
            order = self._rng(epoch, pass_idx, 3).permutation(n) if self.shuffle else None
            for s in range(0, n - b + 1, b):
                yield _take(data, order[s:s + b]) if order is not None else \
                    {k: v[s:s + b] for k, v in data.items()}
            return
        chunks = self._chunks(epoch, pass_idx)
        if self.shuffle:
            chunks = self._shuffled(chunks, epoch, pass_idx)
        pending, have = [], 0
        for chunk in chunks:
            pending.append(chunk)
            have += _rows(chunk)
            if have < b:
                continue
            data = _concat(pending)
            n = _rows(data)
            full = n - n % b
            for s in range(0, full, b):
                yield {k: v[s:s + b] for k, v in data.items()}
            rest = {k: v[full:] for k, v in data.items()} if full < n else None
            pending, have = ([rest], n - full) if rest is not None else ([], 0)

    def batches(self, epoch, steps):
        """Exactly ``steps`` batches for ``epoch``: a fresh pass, cut after
        ``steps`` (continued by further passes if it runs short)."""
        done, pass_idx = 0, 0
        while done < steps:
            got = 0
            for batch in self._pass_batches(epoch, pass_idx):
                yield batch
                got += 1
                done += 1
                if done == steps:
                    return
            if got == 0:
                raise ValueError(f"rank {self.rank}: a pass over its {len(self.files)} "
                                 f"Parquet file(s) ({self._rows} rows) gives no whole batch "
                                 f"of {self.batch_size} rows")
            pass_idx += 1
