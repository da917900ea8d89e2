"""tf.compat.v1 session hooks (Horovod's BroadcastGlobalVariablesHook)."""

import tensorflow as tf

from tfring import ops

__all__ = ["BroadcastGlobalVariablesHook"]


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcasts every global variable from `root_rank` once the session is
    created (tf.compat.v1.train.MonitoredTrainingSession and friends), so
    every rank starts from the same weights. `device` is accepted and does
    nothing: the broadcasts run where the variables live."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            self.bcast_op = ops.broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)
