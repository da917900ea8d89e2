"""The helpers of `horovod.tensorflow.util`, under the same names, so code
(and tests) written against Horovod that import them keep working.

    _executing_eagerly()   True while TensorFlow runs eagerly
    _make_subgraph(f)      f as a tf.function
    _cache(f)              memoizes f(*args) per (args, eager or graph)
    vars_to_refs(vars)     variables (or nested lists of them) as hashable keys
    refs_to_vars(refs)     the inverse of vars_to_refs
"""

import tensorflow as tf
from tensorflow.python.eager import context


def _executing_eagerly():
    """True when eager execution is enabled (not inside a tf.function)."""
    return context.executing_eagerly()


def _make_subgraph(f):
    """f compiled as a tf.function."""
    return tf.function(f)


def _cache(f):
    """f memoized on its (hashable) arguments, separately for eager and
    graph mode: an op built while tracing must not be reused eagerly."""
    results = {}

    def wrapper(*args):
        key = (args, _executing_eagerly())
        if key not in results:
            results[key] = f(*args)
        return results[key]

    return wrapper


def _ref(var):
    # tf.Variable has .ref(); Keras 3 variables are hashable themselves.
    return var.ref() if hasattr(var, "ref") else var


def _deref(ref):
    return ref.deref() if hasattr(ref, "deref") else ref


def vars_to_refs(vars):  # noqa: A002 - Horovod's parameter name
    """A variable's reference (usable as a dict key); a list of them (or of
    such lists) becomes a tuple of references."""
    if isinstance(vars, list):
        return tuple(vars_to_refs(v) for v in vars)
    return _ref(vars)


def refs_to_vars(refs):
    """The variables behind vars_to_refs' result: tuples become lists."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return _deref(refs)
