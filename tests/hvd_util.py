"""What the Horovod API walks (test_hvd_api.py, test_hvd_keras_api.py)
share: the check that a tfring callable takes Horovod's call."""

import inspect

import pytest


def assert_takes_horovod_call(label, fn, params):
    """`params` lists Horovod's parameters in its order; a leading "*" marks
    a required argument, bound positionally. Every call written with
    Horovod's arguments must bind to `fn`, and Horovod's required arguments
    must be positional here too, in Horovod's order."""
    name = label.rsplit(".", 1)[-1]
    sig = inspect.signature(fn)
    positional = [object() for p in params if p.startswith("*")]
    keywords = {p: object() for p in params if not p.startswith("*")}
    try:
        sig.bind(*positional, **keywords)
    except TypeError as e:
        pytest.fail(f"{label}{sig} does not take Horovod's call "
                    f"{name}({', '.join(p.lstrip('*') for p in params)}): {e}")
    names = [p for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(q for q in params if q.startswith("*")):
        assert names[i].name == p[1:], (name, list(sig.parameters), params)
