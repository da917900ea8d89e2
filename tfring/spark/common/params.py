"""EstimatorParams: the Spark ML params of the estimators, with Horovod's
names, defaults, setX/getX methods (horovod.spark.common.params).

Params that only configured Petastorm or NVTabular readers are accepted
and do nothing (PETASTORM_ONLY); the estimator warns when one is set."""

from pyspark import keyword_only
from pyspark.ml.param.shared import Param, Params, TypeConverters

# Params with no effect in tfring (its reader is pyarrow's, in the rank's
# own process), and why.
PETASTORM_ONLY = {
    "train_reader_num_workers": "Petastorm's reader worker pool",
    "val_reader_num_workers": "Petastorm's reader worker pool",
    "reader_pool_type": "Petastorm's reader worker pool",
    "transformation_edit_fields": "Petastorm's TransformSpec (transformation_fn alone is "
                                  "enough here)",
    "transformation_removed_fields": "Petastorm's TransformSpec (transformation_fn alone "
                                     "is enough here)",
    "compress_sparse_cols": "Petastorm's sparse-vector format (tfring writes vectors as "
                            "dense arrays)",
    "continuous_cols": "NVTabular's data module",
    "categorical_cols": "NVTabular's data module",
    "mp_start_method": "Petastorm's reader processes",
    "data_module": "Horovod's Petastorm/NVTabular data modules",
}


def _to_shuffle(value):
    """shuffle: a bool, or (Horovod's older shuffle_buffer_size) a number of
    rows for the shuffle buffer, 0 meaning no shuffling."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 0:
        return value
    raise TypeError(f"shuffle must be a bool or a buffer size in rows (int >= 0), "
                    f"got {value!r}")


def _to_validation(value):
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise TypeError("validation must be a fraction in [0, 1) or a column name, got a bool")
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"validation must be a fraction in [0, 1) or a column name, got "
                    f"{type(value).__name__}")


def _p(name, doc, conv=None):
    if conv is None:
        return Param(Params._dummy(), name, doc)
    return Param(Params._dummy(), name, doc, typeConverter=conv)


class EstimatorParams(Params):
    num_proc = _p("num_proc", "number of processes")
    train_reader_num_workers = _p("train_reader_num_workers",
                                  "Petastorm reader workers (no effect in tfring)")
    val_reader_num_workers = _p("val_reader_num_workers",
                                "Petastorm reader workers (no effect in tfring)")
    reader_pool_type = _p("reader_pool_type", "Petastorm pool type (no effect in tfring)")
    optimizer = _p("optimizer", "optimizer (unscaled learning rate; scaled by size at fit)")
    model = _p("model", "model")
    backend = _p("backend", "backend")
    store = _p("store", "store")
    metrics = _p("metrics", "metrics")
    loss = _p("loss", "loss")
    gradient_compression = _p("gradient_compression", "tfring gradient compression")
    compress_sparse_cols = _p("compress_sparse_cols", "no effect in tfring",
                              TypeConverters.toBoolean)
    loss_weights = _p("loss_weights", "loss weights")
    sample_weight_col = _p("sample_weight_col", "name of the column of sample weights",
                           TypeConverters.toString)
    feature_cols = _p("feature_cols", "feature column names, one per model input",
                      TypeConverters.toListString)
    label_cols = _p("label_cols", "label column names, one per model output",
                    TypeConverters.toListString)
    continuous_cols = _p("continuous_cols", "NVTabular only (no effect in tfring)",
                         TypeConverters.toListString)
    categorical_cols = _p("categorical_cols", "NVTabular only (no effect in tfring)",
                          TypeConverters.toListString)
    validation = _p("validation", "one of: float validation split [0, 1), or string "
                    "validation column name", _to_validation)
    callbacks = _p("callbacks", "callbacks")
    batch_size = _p("batch_size", "batch size (rows per rank per step)", TypeConverters.toInt)
    val_batch_size = _p("val_batch_size", "validation batch size", TypeConverters.toInt)
    epochs = _p("epochs", "epochs", TypeConverters.toInt)
    train_steps_per_epoch = _p("train_steps_per_epoch",
                               "number of training (batches) steps per epoch",
                               TypeConverters.toInt)
    validation_steps_per_epoch = _p("validation_steps_per_epoch",
                                    "number of steps (batches) for validation per epoch",
                                    TypeConverters.toInt)
    random_seed = _p("random_seed", "random seed for Keras and the data order",
                     TypeConverters.toInt)
    shuffle_buffer_size = _p("shuffle_buffer_size",
                             "(deprecated) shuffle buffer size in rows; 0 turns shuffling "
                             "off", TypeConverters.toInt)
    shuffle = _p("shuffle", "whether to shuffle training rows (or a buffer size in rows)",
                 _to_shuffle)
    verbose = _p("verbose", "verbose flag (0=silent, 1=enabled, 2=one line per epoch)",
                 TypeConverters.toInt)
    partitions_per_process = _p("partitions_per_process",
                                "Parquet files of the training data per process",
                                TypeConverters.toInt)
    run_id = _p("run_id", "unique ID for this run; if the run already exists in the store, "
                "training resumes from its last checkpoint", TypeConverters.toString)
    transformation_fn = _p("transformation_fn", "function pandas.DataFrame -> "
                           "pandas.DataFrame applied to every batch read")
    transformation_edit_fields = _p("transformation_edit_fields",
                                    "Petastorm TransformSpec fields (no effect in tfring)")
    transformation_removed_fields = _p("transformation_removed_fields",
                                       "Petastorm TransformSpec fields (no effect in tfring)")
    label_shapes = _p("label_shapes", "the shape (or shapes) of the label column (or columns)")
    inmemory_cache_all = _p("inmemory_cache_all", "cache each rank's shard in memory",
                            TypeConverters.toBoolean)
    use_gpu = _p("use_gpu", "pin each rank to the GPU of its local rank (when there are "
                 "GPUs); False hides the GPUs", TypeConverters.toBoolean)
    mp_start_method = _p("mp_start_method", "no effect in tfring", TypeConverters.toString)
    backward_passes_per_step = _p("backward_passes_per_step",
                                  "local gradient accumulation steps before each allreduce",
                                  TypeConverters.toInt)
    tensorflow_dataset_prefetch_buffer_size = _p(
        "tensorflow_dataset_prefetch_buffer_size",
        "batches tf.data prefetches (0: tf.data.AUTOTUNE)", TypeConverters.toInt)

    def __init__(self):
        super().__init__()
        self._setDefault(
            num_proc=None, store=None, backend=None, model=None, optimizer=None, loss=None,
            loss_weights=None, sample_weight_col=None, metrics=[], feature_cols=None,
            label_cols=None, continuous_cols=None, categorical_cols=None, validation=None,
            gradient_compression=None, compress_sparse_cols=False, batch_size=32,
            val_batch_size=None, epochs=1, verbose=1, callbacks=[], random_seed=None,
            shuffle_buffer_size=None, shuffle=True, partitions_per_process=10, run_id=None,
            train_steps_per_epoch=None, validation_steps_per_epoch=None,
            transformation_fn=None, transformation_edit_fields=None,
            transformation_removed_fields=None, train_reader_num_workers=2,
            val_reader_num_workers=2, reader_pool_type="thread", label_shapes=None,
            inmemory_cache_all=False, use_gpu=True, mp_start_method=None,
            backward_passes_per_step=1, tensorflow_dataset_prefetch_buffer_size=0)

    @keyword_only
    def setParams(self, **kwargs):
        return self._set(**kwargs)

    def ignored_params(self):
        """The params set here that do nothing in tfring: name -> what they
        configured in Horovod."""
        out = {}
        for name, what in PETASTORM_ONLY.items():
            if self.hasParam(name) and self.isSet(self.getParam(name)):
                value = self.getOrDefault(self.getParam(name))
                if value not in (None, False, [], ()):
                    out[name] = what
        return out


def _accessors(cls, names):
    """Horovod's setX/getX for each param name (snake_case -> CamelCase)."""
    special = {"shuffle_buffer_size": "ShufflingBufferSize",
               "train_reader_num_workers": "TrainReaderNumWorker",
               "val_reader_num_workers": "ValReaderNumWorker",
               "inmemory_cache_all": "InMemoryCacheAll"}

    def make(name):
        def setter(self, value):
            return self._set(**{name: value})

        def getter(self):
            return self.getOrDefault(getattr(self, name))

        return setter, getter

    for name in names:
        camel = special.get(name) or "".join(w.capitalize() for w in name.split("_"))
        setter, getter = make(name)
        setter.__name__, getter.__name__ = f"set{camel}", f"get{camel}"
        setter.__doc__ = f"Sets the value of :py:attr:`{name}`."
        getter.__doc__ = f"Gets the value of :py:attr:`{name}` or its default."
        if f"set{camel}" not in cls.__dict__:
            setattr(cls, f"set{camel}", setter)
        if f"get{camel}" not in cls.__dict__:
            setattr(cls, f"get{camel}", getter)


_accessors(EstimatorParams, [n for n, v in vars(EstimatorParams).items()
                             if isinstance(v, Param)])
