"""KerasEstimator: a Spark ML Estimator that trains a Keras model on a
DataFrame with tfring, as horovod.spark.keras.KerasEstimator does.

    store = Store.create("/shared/tfring")
    est = KerasEstimator(num_proc=4, store=store, model=model,
                         optimizer=keras.optimizers.SGD(0.01), loss="mse",
                         feature_cols=["features"], label_cols=["y"],
                         batch_size=64, epochs=10, validation=0.1)
    keras_model = est.fit(df)            # a KerasModel (model.py)
    pred = keras_model.transform(test_df)

fit(df), in order:
  1. on the driver, before any Spark job: the params (model, loss,
     optimizer, one feature column per model input and one label column
     per output; backend and num_proc are not both given), then the
     columns: each exists, is numeric, and its per-row shape fits its model
     input or output (an array's length is read from the first row, one
     small job; a VectorAssembler vector's from its schema). Each error
     names the column;
  2. prepare.py writes the needed columns to Parquet in the store
     (train/val split, num_proc * partitions_per_process files);
  3. the run: a run_id whose checkpoint is in the store resumes from it
     (its weights, optimizer state and epoch count); the backend runs
     remote.train on num_proc ranks (remote.py); rank 0 publishes a
     checkpoint and TensorBoard logs to the run's folder every epoch;
  4. the driver loads rank 0's model (learning rate divided back by the
     number of ranks, as Horovod does; a schedule unwrapped back to the
     user's) and returns a KerasModel with the
     history (the ranks' average per epoch, from the start of the run).
A rank that fails raises tfring.spark.SparkJobError naming it; temporary
files the run left in the store are removed. The estimator is Spark ML
persistable (save/load, a Pipeline stage: _estimator_persistence.py).
docs/spark-estimator.md has the details.
"""

import secrets
import sys
import time
import warnings

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.param.shared import Param, Params
from pyspark.ml.util import MLReadable, MLWritable

from tfring.spark.common import metadata as md
from tfring.spark.common import prepare
from tfring.spark.common.backend import SparkBackend
from tfring.spark.common.params import EstimatorParams
from tfring.spark.keras import _estimator_persistence as persistence
from tfring.spark.keras import _serialize as ser
from tfring.spark.keras import remote


class KerasEstimator(Estimator, EstimatorParams, MLReadable, MLWritable):
    """Spark Estimator fitting a Keras 3 model to a DataFrame on tfring
    ranks (Horovod's KerasEstimator, same params).

    Args:
        num_proc: ranks (default: spark.default.parallelism). Not with backend.
        model: the Keras model (functional or Sequential with keras.Input).
        backend: a Backend running the training (default: SparkBackend(num_proc)).
        store: the Store for the data, checkpoints and logs (required).
        custom_objects: Keras custom objects the model, loss or metrics need.
        optimizer: a Keras optimizer (or its name), unscaled: its learning rate
            (or LearningRateSchedule) is multiplied by the number of ranks.
            Default: the compiled model's optimizer.
        loss, loss_weights, metrics: as for model.compile.
        sample_weight_col: a column of per-row weights.
        gradient_compression: a tfring.Compression for the gradient allreduce.
        feature_cols: one column per model input, in order; label_cols: one
            per output. Numeric scalars, arrays (of arrays) or ML vectors.
        validation: a fraction in [0, 1) of the rows, or a column of booleans
            or integers (true / > 0: validation row).
        callbacks: Keras callbacks (tfring's LearningRate* callbacks get the
            scaled learning rate as initial_lr).
        batch_size: rows per rank per step (32); val_batch_size (batch_size).
        epochs (1), verbose (1; rank 0 prints), random_seed (seeds Keras on
            every rank and the data order).
        shuffle: shuffle training rows (True), or a shuffle buffer size in
            rows; shuffle_buffer_size (Horovod's older name) too, 0 = off.
        partitions_per_process: Parquet files per rank (10).
        run_id: the run's folder in the store; an existing run resumes from
            its checkpoint. Default: keras_<time>_<random>.
        train_steps_per_epoch, validation_steps_per_epoch: steps per epoch
            (default: the smallest shard's whole batches).
        transformation_fn: pandas.DataFrame -> pandas.DataFrame applied to
            every batch read (it must keep the columns and shapes).
        label_shapes: per-row shapes to reshape the labels to.
        checkpoint_callback: a keras.callbacks.ModelCheckpoint for rank 0 (its
            filepath is set by the estimator; e.g. save_best_only=True); the
            model it saved last is the one fit returns.
        inmemory_cache_all: each rank keeps its shard in memory after the
            first read.
        backend_env: variables for the ranks.
        use_gpu: pin each rank to a GPU by local rank (True) or hide GPUs.
        backward_passes_per_step: local gradient accumulation (1).
        tensorflow_dataset_prefetch_buffer_size: batches to prefetch (0: AUTOTUNE).
        train_reader_num_workers, val_reader_num_workers, reader_pool_type,
        data_module, continuous_cols, categorical_cols, compress_sparse_cols,
        transformation_edit_fields, transformation_removed_fields,
        mp_start_method: Petastorm/NVTabular settings, accepted with a
            warning that they do nothing.
    """

    custom_objects = Param(Params._dummy(), "custom_objects", "custom objects")
    checkpoint_callback = Param(Params._dummy(), "checkpoint_callback",
                                "model checkpointing callback")
    data_module = Param(Params._dummy(), "data_module", "no effect in tfring")
    backend_env = Param(Params._dummy(), "backend_env",
                        "dict to add to the environment of the ranks")

    @keyword_only
    def __init__(self, num_proc=None, data_module=None, model=None, backend=None, store=None,
                 custom_objects=None, optimizer=None, loss=None, loss_weights=None,
                 sample_weight_col=None, gradient_compression=None, metrics=None,
                 feature_cols=None, label_cols=None, continuous_cols=None,
                 categorical_cols=None, validation=None, callbacks=None, batch_size=None,
                 val_batch_size=None, epochs=None, verbose=None, random_seed=None,
                 shuffle_buffer_size=None, shuffle=True, partitions_per_process=None,
                 run_id=None, train_steps_per_epoch=None, validation_steps_per_epoch=None,
                 transformation_fn=None, train_reader_num_workers=None,
                 val_reader_num_workers=None, reader_pool_type="thread", label_shapes=None,
                 checkpoint_callback=None, inmemory_cache_all=False, backend_env=None,
                 use_gpu=True, mp_start_method=None,
                 tensorflow_dataset_prefetch_buffer_size=0, transformation_edit_fields=None,
                 transformation_removed_fields=None, compress_sparse_cols=False,
                 backward_passes_per_step=1):
        super().__init__()
        self._setDefault(data_module=None, optimizer=None, custom_objects={},
                         checkpoint_callback=None,
                         backend_env={"LIBHDFS_OPTS": "-Xms2048m -Xmx2048m"})
        self.setParams(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def setCustomObjects(self, value):
        return self._set(custom_objects=value)

    def getCustomObjects(self):
        return self.getOrDefault(self.custom_objects)

    def setCheckpointCallback(self, value):
        return self._set(checkpoint_callback=value)

    def getCheckpointCallback(self):
        return self.getOrDefault(self.checkpoint_callback)

    def setBackendEnv(self, value):
        return self._set(backend_env=value)

    def getBackendEnv(self):
        return self.getOrDefault(self.backend_env)

    def setDataModule(self, value):
        return self._set(data_module=value)

    def getDataModule(self):
        return self.getOrDefault(self.data_module)

    # --- persistence (_estimator_persistence.py) ----------------------------------------

    def write(self):
        """A writer: `estimator.write().overwrite().save(path)`. The model
        is saved as a .keras file, the params as JSON; the backend is not
        saved; a callback (or other value) that Keras cannot serialize is
        refused, naming it."""
        return persistence.KerasEstimatorWriter(self)

    @classmethod
    def read(cls, custom_objects=None, safe_mode=True):
        """A reader: `KerasEstimator.read().load(path)`. `custom_objects` are
        those the estimator was saved with (registered Keras serializables
        need not be passed); `safe_mode=False` lets Lambda layers load."""
        return persistence.KerasEstimatorReader(cls, custom_objects, safe_mode)

    @classmethod
    def load(cls, path, custom_objects=None, safe_mode=True):
        """The KerasEstimator saved at `path` (a local path or a
        pyarrow/fsspec URL): its params, its model, and a store recreated
        from its prefix path."""
        return cls.read(custom_objects, safe_mode).load(path)

    # --- driver-side checks ------------------------------------------------

    def _log(self, msg):
        if self.getVerbose():
            print(msg, file=sys.stdout, flush=True)

    def _get_or_create_backend(self):
        backend = self.getBackend()
        if backend is not None:
            if self.getNumProc() is not None:
                raise ValueError("KerasEstimator: give backend or num_proc, not both (the "
                                 "backend decides how many ranks run: "
                                 f"backend.num_processes() = {backend.num_processes()})")
            return backend
        return SparkBackend(self.getNumProc(), verbose=self.getVerbose())

    def _check_params(self):
        """The params that need no data: returns the model."""
        import keras

        for name, what in self.ignored_params().items():
            warnings.warn(f"KerasEstimator: {name} does nothing in tfring: it configured "
                          f"{what}, and tfring reads Parquet with pyarrow in each rank",
                          UserWarning, stacklevel=4)
        model = self.getModel()
        if model is None:
            raise ValueError("KerasEstimator: the model param is required")
        if not isinstance(model, keras.Model):
            raise TypeError(f"KerasEstimator: model must be a keras.Model (Keras 3), got "
                             f"{type(model).__name__}")
        try:
            inputs, outputs = model.inputs, model.outputs
        except (AttributeError, ValueError):
            inputs = outputs = None
        if not inputs or not outputs:
            raise ValueError("KerasEstimator: the model has no defined inputs/outputs: build "
                             "it from keras.Input (functional, or Sequential starting with "
                             "keras.Input) so columns can be matched to its inputs")
        if self.getStore() is None:
            raise ValueError("KerasEstimator: a store is required (tfring.spark.common.store."
                             "Store.create('/shared/path') or an hdfs:// or s3:// URL)")
        if not self.getLoss():
            raise ValueError("KerasEstimator: the loss param is required")
        if self.getOptimizer() is None and getattr(model, "optimizer", None) is None:
            raise ValueError("KerasEstimator: give an optimizer, or a model compiled with one")
        feature_cols, label_cols = self.getFeatureCols(), self.getLabelCols()
        if not feature_cols:
            raise ValueError("KerasEstimator: feature_cols is required (one column per model "
                             "input)")
        if not label_cols:
            raise ValueError("KerasEstimator: label_cols is required (one column per model "
                             "output)")
        self._check_counts(feature_cols, label_cols, inputs, outputs)
        ck = self.getCheckpointCallback()
        if ck is not None and getattr(ck, "save_weights_only", False):
            raise ValueError("KerasEstimator: checkpoint_callback must save whole models "
                             "(save_weights_only=False): the run resumes from the .keras file "
                             "it writes")
        if self.getBatchSize() < 1:
            raise ValueError(f"KerasEstimator: batch_size must be >= 1, got "
                             f"{self.getBatchSize()}")
        if self.getEpochs() < 1:
            raise ValueError(f"KerasEstimator: epochs must be >= 1, got {self.getEpochs()}")
        prepare.check_validation(self.getValidation())
        return model

    def _check_counts(self, feature_cols, label_cols, inputs, outputs):
        if len(feature_cols) != len(inputs):
            raise ValueError(f"KerasEstimator: feature_cols has {len(feature_cols)} columns "
                             f"{feature_cols} but the model has {len(inputs)} inputs: give one "
                             "column per input, in the order of model.inputs")
        shapes = self.getLabelShapes()
        n_out = len(shapes) if shapes is not None else len(outputs)
        if len(label_cols) != n_out:
            raise ValueError(f"KerasEstimator: label_cols has {len(label_cols)} columns "
                             f"{label_cols} but the model has {n_out} outputs: give one "
                             "column per output")

    def _columns(self):
        cols = self.getFeatureCols() + self.getLabelCols()
        w = self.getSampleWeightCol()
        return list(dict.fromkeys(cols + ([w] if w else [])))

    def _check_data(self, model, metadata):
        md.check_shapes(metadata, self.getFeatureCols(), self.getLabelCols(),
                        md.model_shapes(model.inputs), md.model_shapes(model.outputs),
                        self.getLabelShapes())
        w = self.getSampleWeightCol()
        if w and w in metadata and metadata[w]["spark_type"] != md.SCALAR:
            raise ValueError(f"sample_weight_col {w!r} must be a numeric scalar column")

    # --- fit -------------------------------------------------------------------

    def fit_on_parquet(self, params=None, dataset_idx=None):
        """Trains on Parquet data already in the store:
        store.get_train_data_path(dataset_idx) and, when it exists,
        get_val_data_path(dataset_idx) (written by an earlier fit, whose
        idx the log names, or by you). Returns a KerasModel."""
        if params:
            return self.copy(params)._fit_on_parquet(dataset_idx)
        return self._fit_on_parquet(dataset_idx)

    def _fit_on_parquet(self, dataset_idx=None):
        model = self._check_params()
        backend = self._get_or_create_backend()
        info = prepare.read_data_info(self.getStore(), dataset_idx, self._columns(),
                                      backend.num_processes())
        self._check_data(model, info.metadata)
        return self._fit_on_prepared_data(backend, info)

    def _fit(self, df):
        model = self._check_params()
        backend = self._get_or_create_backend()
        validation = self.getValidation()
        prepare.check_validation(validation, df.columns, df.schema)
        # Columns whose shapes the schema gives are checked before the first
        # row is read (a Spark job) for the others.
        self._check_data(model, md.known(md.column_metadata(df, self._columns(),
                                                            read_row=False)))
        metadata = md.column_metadata(df, self._columns())
        self._check_data(model, metadata)
        self._compile_args()  # losses/metrics that cannot travel fail here
        info = prepare.prepare_data(
            df, self.getStore(), backend.num_processes(), self.getFeatureCols(),
            self.getLabelCols(), metadata, sample_weight_col=self.getSampleWeightCol(),
            validation=validation, partitions_per_process=self.getPartitionsPerProcess(),
            random_seed=self.getRandomSeed(), verbose=self.getVerbose(), log=self._log)
        return self._fit_on_prepared_data(backend, info)

    def _compile_args(self):
        co = self.getCustomObjects()
        return (ser.serialize_compile_arg(self.getLoss(), co, "loss"),
                ser.serialize_compile_arg(self.getMetrics(), co, "metric"))

    def _shuffle(self):
        """(shuffle, buffer rows or None)."""
        shuffle, size = self.getShuffle(), self.getShufflingBufferSize()
        if size is not None:
            return bool(shuffle) and size > 0, max(0, size)
        if isinstance(shuffle, bool):
            return shuffle, None
        return shuffle > 0, shuffle

    def _fit_on_prepared_data(self, backend, info):
        import keras

        store = self.getStore()
        model = self.getModel()
        run_id = self.getRunId() or \
            f"keras_{time.strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(3)}"
        epochs = self.getEpochs()
        resume = self._checkpoint(store, run_id)
        if resume is not None:
            model_bytes, tag = resume
            initial_epoch, prior = int(tag.get("epoch", 0)), tag.get("history") or {}
            self._log(f"KerasEstimator: run {run_id} resumes from its checkpoint after epoch "
                      f"{initial_epoch}")
            if initial_epoch >= epochs:
                return self._model_from(model_bytes, prior, run_id, info, tag.get("size") or 1,
                                        tag.get("base_lr"))
        else:
            model_bytes, initial_epoch, prior = ser.model_to_bytes(model), 0, {}
        optimizer = self.getOptimizer() or model.optimizer
        opt_config, base_lr = ser.serialize_optimizer(optimizer)
        loss, metrics = self._compile_args()
        shuffle, buffer_rows = self._shuffle()
        seed = self.getRandomSeed()
        spec = remote.TrainSpec(
            model_bytes=model_bytes, resume=resume is not None, initial_epoch=initial_epoch,
            prior_history=prior, optimizer=opt_config, base_lr=base_lr, loss=loss,
            loss_weights=self.getLossWeights(), metrics=metrics,
            custom_objects=self.getCustomObjects(), feature_cols=list(self.getFeatureCols()),
            label_cols=list(self.getLabelCols()), sample_weight_col=self.getSampleWeightCol(),
            metadata=info.metadata, label_shapes=self.getLabelShapes(),
            train_files=info.train_files, val_files=info.val_files,
            batch_size=self.getBatchSize(), val_batch_size=self.getValBatchSize(),
            epochs=epochs, train_steps_per_epoch=self.getTrainStepsPerEpoch(),
            validation_steps_per_epoch=self.getValidationStepsPerEpoch(), shuffle=shuffle,
            buffer_rows=buffer_rows, seed=seed if seed is not None else secrets.randbits(31),
            inmemory_cache_all=self.getInMemoryCacheAll(),
            transformation_fn=self.getTransformationFn(),
            prefetch=self.getTensorflowDatasetPrefetchBufferSize(),
            callbacks=list(self.getCallbacks() or []),
            checkpoint_callback=self.getCheckpointCallback(), verbose=self.getVerbose(),
            use_gpu=self.getUseGpu(), random_seed=seed,
            gradient_compression=self.getGradientCompression(),
            backward_passes_per_step=self.getBackwardPassesPerStep(), store=store,
            run_id=run_id, floatx=keras.backend.floatx())
        try:
            results = backend.run(remote.train, args=(spec,), env=self.getBackendEnv())
        except BaseException:
            self._clean_run(store, run_id)
            raise
        result = results[0]
        if not result:
            raise RuntimeError("KerasEstimator: rank 0 returned no result")
        self._last_timing = result.get("timing")  # rank 0's phases (benchmarks/)
        return self._model_from(result["model"], result["history"], run_id, info,
                                result["size"], base_lr)

    def _checkpoint(self, store, run_id):
        """(bytes, tag) of the run's checkpoint in the store, or None."""
        path = store.get_checkpoint_path(run_id)
        if path is None:
            return None
        url = f"{path}/{store.get_checkpoint_filename()}"
        if not store.exists(url):
            return None
        data = store.read(url)
        tag = ser.read_tag(data)
        if tag is None:
            raise ValueError(f"KerasEstimator: {url} is not a checkpoint written by tfring (no "
                             f"{ser.CHECKPOINT_TAG}); use another run_id or remove it")
        return data, tag

    @staticmethod
    def _clean_run(store, run_id):
        try:
            path = store.get_run_path(run_id)
            if store.exists(path):
                store.remove_temporary_files(path)
        except Exception:  # noqa: BLE001 - the training error matters more
            pass

    def _model_from(self, model_bytes, history, run_id, info, size, base_lr):
        """The KerasModel of rank 0's model: its learning rate divided by the
        number of ranks (the unscaled rate, as Horovod returns it), or its
        schedule the user's own again (unwrapped from the ranks'
        ScaledLearningRateSchedule)."""
        import keras

        from tfring.spark.keras import _schedule
        from tfring.spark.keras.model import KerasModel

        co = self.getCustomObjects()
        try:
            model = ser.bytes_to_model(model_bytes, co, compile=True)
        except Exception as e:  # noqa: BLE001 - e.g. a custom loss not in custom_objects
            warnings.warn(f"KerasEstimator: the trained model loads uncompiled ({e})",
                          UserWarning, stacklevel=3)
            model = ser.bytes_to_model(model_bytes, co, compile=False)
        opt = getattr(model, "optimizer", None)
        if opt is not None:
            _schedule.unscale_optimizer(opt)
        if opt is not None and base_lr is not None and size and size > 1:
            try:
                opt.learning_rate = float(keras.ops.convert_to_numpy(opt.learning_rate)) / size
            except (TypeError, ValueError, AttributeError):
                pass
        label_cols = list(self.getLabelCols())
        feature_cols = list(self.getFeatureCols())
        meta = {c: dict(info.metadata[c]) for c in feature_cols + label_cols}
        return KerasModel(history=history, model=model, feature_columns=feature_cols,
                          label_columns=label_cols, custom_objects=co, run_id=run_id,
                          _metadata=meta, _floatx=keras.backend.floatx())
