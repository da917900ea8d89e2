"""KerasModel: the Spark ML Model that KerasEstimator.fit returns, with the
params and methods of Horovod's horovod.spark.keras.KerasModel.

    model = estimator.fit(train_df)          # or KerasModel(model=..., ...)
    pred = model.transform(test_df)          # adds <label>__output columns
    model.write().overwrite().save(path)     # a folder: metadata + model.keras
    same = KerasModel.load(path)             # in any Spark session

transform runs the Keras model on the executors, one call per Arrow batch
of rows, the model loaded once per Python worker (_predict.py); persistence
is Spark ML's writer/reader protocol over pyarrow/fsspec filesystems
(_persistence.py). See docs/spark-model.md.
"""

from pyspark import keyword_only
from pyspark.ml import Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasOutputCols
from pyspark.ml.util import MLReadable, MLWritable

from tfring.spark.keras import _persistence, _predict


class KerasModel(Model, HasOutputCols, MLReadable, MLWritable):
    """Spark Transformer wrapping a trained Keras model, for predictions on
    a DataFrame. `getModel()` gives the Keras model itself.

    Args:
        history: metric name -> list of per-epoch values from training.
        model: the trained Keras model.
        feature_columns: one column per model input, in the order of
            model.inputs: numeric scalars, arrays or Spark ML vectors.
        label_columns: one column per model output; each output column
            takes its type from its label column.
        custom_objects: Keras custom objects (name -> class or function)
            the model needs to load.
        run_id: ID of the run that trained the model.
        _metadata: column name -> {"spark_type": "vector"|"array"|"scalar",
            "dtype", "shape", "sql_type"} for the feature and label columns.
        _floatx: Keras' default float type on the executors (unset: theirs).
    """

    history = Param(Params._dummy(), "history", "history")
    model = Param(Params._dummy(), "model", "model")
    feature_columns = Param(Params._dummy(), "feature_columns", "feature columns")
    label_columns = Param(Params._dummy(), "label_columns", "label columns")
    run_id = Param(Params._dummy(), "run_id",
                   "unique ID for the run that generated this model, if no ID was given by "
                   "the user, defaults to current timestamp at the time of fit()",
                   typeConverter=TypeConverters.toString)
    _metadata = Param(Params._dummy(), "_metadata",
                      "metadata contains the shape and type of input and output")
    custom_objects = Param(Params._dummy(), "custom_objects", "custom objects")
    _floatx = Param(Params._dummy(), "_floatx", "keras default float type")

    @keyword_only
    def __init__(self, history=None, model=None, feature_columns=None, label_columns=None,
                 custom_objects=None, run_id=None, _metadata=None, _floatx=None):
        super().__init__()
        if label_columns:
            self.setOutputCols([col + "__output" for col in label_columns])
        self._setDefault(custom_objects={})
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs):
        return self._set(**kwargs)

    # Horovod's getters and setters.

    def setHistory(self, value):
        return self._set(history=value)

    def getHistory(self):
        return self.getOrDefault(self.history)

    def setModel(self, value):
        return self._set(model=value)

    def getModel(self):
        """The trained Keras model (a plain keras.Model)."""
        return self.getOrDefault(self.model)

    def setFeatureColumns(self, value):
        return self._set(feature_columns=value)

    def getFeatureColumns(self):
        return self.getOrDefault(self.feature_columns)

    def setLabelColumns(self, value):
        return self._set(label_columns=value)

    setLabelColoumns = setLabelColumns  # Horovod's spelling

    def getLabelColumns(self):
        return self.getOrDefault(self.label_columns)

    def setRunId(self, value):
        return self._set(run_id=value)

    def getRunId(self):
        return self.getOrDefault(self.run_id)

    def setOutputCols(self, value):
        """Names of the prediction columns, one per label column (default
        `<label>__output`)."""
        return self._set(outputCols=value)

    def setCustomObjects(self, value):
        return self._set(custom_objects=value)

    def getCustomObjects(self):
        return self.getOrDefault(self.custom_objects)

    def _param(self, param):
        return self.getOrDefault(param) if self.isDefined(param) else None

    def _get_metadata(self):
        return self._param(self._metadata)

    def _get_floatx(self):
        return self._param(self._floatx)

    # Transformer.

    def transform(self, df, params=None):
        """Transforms the input dataset with prediction columns representing
        model predictions.

        Prediction column names default to <label_column>__output. Override
        column names by calling `transformer.setOutputCols(col_names)`.

        Args:
            df: Input dataset, which is an instance of
                :py:class:`pyspark.sql.DataFrame`.
            params: An optional param map that overrides embedded params.

        Returns:
            Transformed dataset: every column of `df`, then one prediction
            column per label column.
        """
        return super().transform(df, params)

    def _transform(self, df):
        feature_cols = self._param(self.feature_columns)
        label_cols = self._param(self.label_columns)
        if not feature_cols:
            raise ValueError("KerasModel has no feature columns (setFeatureColumns)")
        if not label_cols:
            raise ValueError("KerasModel has no label columns: they type and name the "
                             "prediction columns")
        output_cols = self._param(self.outputCols) or [c + "__output" for c in label_cols]
        return _predict.transform(df, self.getModel(), feature_cols, label_cols, output_cols,
                                  self._get_metadata(), self.getCustomObjects(),
                                  self._get_floatx())

    # Persistence.

    def write(self):
        """A writer: `model.write().overwrite().save(path)`."""
        return _persistence.KerasModelWriter(self)

    @classmethod
    def read(cls, custom_objects=None, safe_mode=True):
        """A reader: `KerasModel.read().load(path)`. `custom_objects` are
        those the model was saved with (registered Keras serializables need
        not be passed); `safe_mode=False` lets Lambda layers load."""
        return _persistence.KerasModelReader(cls, custom_objects, safe_mode)

    @classmethod
    def load(cls, path, custom_objects=None, safe_mode=True):
        """The KerasModel saved at `path` (a local path or a pyarrow/fsspec
        URL), with its Keras model compiled as it was saved."""
        return cls.read(custom_objects, safe_mode).load(path)
