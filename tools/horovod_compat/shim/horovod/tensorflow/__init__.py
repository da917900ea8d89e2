"""`horovod.tensorflow` is tfring itself: the module object in sys.modules is
replaced by tfring's, so `import horovod.tensorflow as hvd` binds exactly
what `import tfring as hvd` binds (no wrappers, no renames). Horovod's
submodules that its tests import map to tfring's modules of the same
meaning."""

import sys

import tfring
import tfring.elastic
import tfring.util

sys.modules["horovod.tensorflow.util"] = tfring.util
sys.modules["horovod.tensorflow.elastic"] = tfring.elastic
sys.modules[__name__] = tfring
