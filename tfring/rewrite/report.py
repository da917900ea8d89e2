"""The record of a graph rewrite: RewriteReport (what `tfring.rewrite(graph)`
returns) and RewrittenGradient (one rerouted gradient in it)."""

import dataclasses


@dataclasses.dataclass
class RewrittenGradient:
    """One gradient tensor the rewrite rerouted."""
    tensor: str        # the gradient's name in the graph, before the rewrite
    update: str        # the optimizer update that consumed it
    kind: str          # "dense" (allreduced), "sparse_values", "sparse_indices" (allgathered)
    bytes: object      # static size in bytes, None when the shape is dynamic


@dataclasses.dataclass
class RewriteReport:
    """What `tfring.rewrite(graph)` changed."""
    gradients: list = dataclasses.field(default_factory=list)
    allreduce_ops: list = dataclasses.field(default_factory=list)
    allgather_ops: list = dataclasses.field(default_factory=list)
    broadcast_variables: list = dataclasses.field(default_factory=list)
    # Assigns root_rank's current value to every global variable: run it
    # after restoring a checkpoint (initializers already broadcast).
    broadcast_op: object = None
    # Gradients found already rerouted by an earlier call.
    already_rewritten: int = 0

    @property
    def count(self):
        """Gradients rerouted (a sparse gradient's values and indices count
        once)."""
        return sum(g.kind != "sparse_indices" for g in self.gradients)

    @property
    def dense_count(self):
        return sum(g.kind == "dense" for g in self.gradients)

    @property
    def sparse_count(self):
        return sum(g.kind == "sparse_values" for g in self.gradients)

    @property
    def bytes(self):
        """Static bytes of the dense gradients allreduced per step."""
        return sum(g.bytes or 0 for g in self.gradients if g.kind == "dense")

    def __str__(self):
        lines = [f"tfring.rewrite: {self.dense_count} dense gradients "
                 f"({self.bytes / 2**20:.2f} MiB) in "
                 f"{len(self.allreduce_ops)} allreduce ops, "
                 f"{self.sparse_count} sparse gradients in "
                 f"{len(self.allgather_ops)} allgather ops, "
                 f"{len(self.broadcast_variables)} variable initializers "
                 f"broadcast"
                 + (f", {self.already_rewritten} gradients already rewritten"
                    if self.already_rewritten else "")]
        for g in self.gradients:
            size = "?" if g.bytes is None else g.bytes
            lines.append(f"  {g.kind:15s} {g.tensor} -> {g.update} ({size} B)")
        return "\n".join(lines)
