"""Checkpoints that let a killed data-parallel fit resume where it stopped.

    ckpt = tfring.keras.callbacks.ResumableCheckpointCallback("ckpt/")
    initial_epoch = ckpt.restore(model)          # every rank, before fit
    model.fit(x_mine, y_mine, epochs=10, initial_epoch=initial_epoch,
              callbacks=[tfring.keras.callbacks.RingAllreduceCallback(), ckpt])

The protocol:

* Saving: at the end of every `every_epochs`-th epoch, root_rank alone
  writes the whole training state - every model variable (weights,
  non-trainable statistics, the random seed generators' states) and every
  optimizer variable (iteration count, learning rate, slots) - with the
  number of finished epochs, to `<directory>/epoch-<N>.npz`. The file is
  written under a temporary name and renamed, so a rank killed while
  writing leaves the previous checkpoints intact; the newest `keep` are
  kept.
* Restoring: every rank calls restore(model). root_rank picks the newest
  checkpoint it can read (older ones are tried if the newest is unreadable)
  and broadcasts the epoch to resume from; if there is one, root_rank
  loads it and broadcasts the model's and optimizer's values, so the other
  ranks need no access to root_rank's filesystem. Every rank then returns
  the same initial_epoch for fit.

Resuming is at epoch granularity: a run killed in the middle of epoch E
repeats epoch E from the checkpoint written after E - 1 (use a smaller
steps_per_epoch for finer-grained checkpoints). With deterministic
settings - the same data order in each epoch (e.g. shuffle=False, or an
order that depends only on the epoch), the same number of ranks, the same
thread settings - the resumed run ends with the weights of an uninterrupted
run, bit for bit.
"""

import glob
import os
import re

import numpy as np

from tfring import basics
from tfring.compression.powersgd import attached
from tfring.keras._state import broadcast_model, optimizer_variables

_NAME = re.compile(r"^epoch-(\d+)\.npz$")


def checkpoint_path(directory, epoch):
    return os.path.join(directory, f"epoch-{epoch:06d}.npz")


def list_checkpoints(directory):
    """(epoch, path) of the complete checkpoints in directory, oldest first."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(directory), "epoch-*.npz")):
        m = _NAME.match(os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)


def _state_variables(model, build_optimizer):
    if not model.built:
        raise ValueError(
            "tfring.keras checkpoint: the model is not built; give it a "
            "keras.Input (or call model.build) before saving or restoring")
    opt = getattr(model, "optimizer", None)
    # Keras 3 optimizers say whether they are built; tf_keras ones do not,
    # and their build() does nothing the second time.
    if (build_optimizer and opt is not None
            and getattr(opt, "built", None) is not True and hasattr(opt, "build")):
        opt.build(model.trainable_variables)
    return list(model.variables), optimizer_variables(opt)


def _value(v):
    return np.array(v.numpy() if hasattr(v, "numpy") else v, order="C")


def save_checkpoint(model, directory, epoch):
    """Writes model and optimizer state after `epoch` finished epochs
    (this process only; the callback calls it on root_rank). Returns the
    path."""
    model_vars, opt_vars = _state_variables(model, build_optimizer=False)
    arrays = {"epoch": np.array(epoch, np.int64)}
    psgd = attached(getattr(model, "optimizer", None))
    if psgd is not None:
        # PowerSGD's step counters (its warm-up is counted in steps); its
        # errors are each rank's own and start again from zero.
        arrays["powersgd.steps"] = np.array(psgd.step_counts(), np.int64)
    for prefix, variables in (("model", model_vars), ("optimizer", opt_vars)):
        arrays[f"{prefix}.count"] = np.array(len(variables), np.int64)
        for i, v in enumerate(variables):
            arrays[f"{prefix}.{i}"] = _value(v)
    os.makedirs(directory, exist_ok=True)
    path = checkpoint_path(directory, epoch)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    return path


def _read(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _assign(path, arrays, prefix, variables):
    count = int(arrays[f"{prefix}.count"])
    if count != len(variables):
        raise ValueError(
            f"tfring.keras checkpoint {path}: holds {count} {prefix} "
            f"variables, the model has {len(variables)}; restore into the "
            f"model (and optimizer) the checkpoint was written from")
    for i, v in enumerate(variables):
        value = arrays[f"{prefix}.{i}"]
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(
                f"tfring.keras checkpoint {path}: {prefix} variable "
                f"{getattr(v, 'path', getattr(v, 'name', i))!r} has shape "
                f"{tuple(v.shape)}, the checkpoint {tuple(value.shape)}")
        v.assign(value)


def _newest_readable(directory):
    """(epoch, arrays, path) of the newest checkpoint that loads, or
    (0, None, None)."""
    for epoch, path in reversed(list_checkpoints(directory)):
        try:
            return epoch, _read(path), path
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file
            print(f"tfring.keras: skipping unreadable checkpoint {path}: {e}",
                  flush=True)
    return 0, None, None


def restore_checkpoint(model, directory, root_rank=0):
    """Collective: every rank calls it before fit. Loads root_rank's newest
    checkpoint in `directory` into the model and its optimizer on every
    rank; returns the number of finished epochs it holds (0 when there is
    none: nothing is changed), to pass to fit as initial_epoch."""
    from tfring import _core

    root = int(root_rank)
    epoch, arrays, path, error = 0, None, None, None
    if basics.rank() == root:
        try:
            epoch, arrays, path = _newest_readable(directory)
        except Exception as e:  # noqa: BLE001 - sent to the other ranks first
            epoch, error = -1, e
    if basics.size() > 1:
        got = _core.broadcast(np.array([epoch], np.int64), root=root,
                              name="tfring.keras.checkpoint.epoch")
        epoch = int(got[0])
    if error is not None:
        raise error
    if epoch < 0:
        raise RuntimeError(
            f"tfring.keras: rank {root} could not read its checkpoints in "
            f"{directory!r} (its error says why)")
    if epoch == 0:
        return 0
    model_vars, opt_vars = _state_variables(model, build_optimizer=True)
    failed = 0
    if basics.rank() == root:
        try:
            _assign(path, arrays, "model", model_vars)
            _assign(path, arrays, "optimizer", opt_vars)
        except Exception as e:  # noqa: BLE001 - the others learn of it first
            failed, error = 1, e
    if basics.size() > 1:
        failed = int(_core.broadcast(np.array([failed], np.int64), root=root,
                                     name="tfring.keras.checkpoint.loaded")[0])
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(
            f"tfring.keras: rank {root} could not load its checkpoint of "
            f"epoch {epoch} in {directory!r} (its error says why)")
    broadcast_model(model, root)
    _restore_powersgd_steps(model, arrays, root)
    return epoch


def _restore_powersgd_steps(model, arrays, root):
    """root's saved PowerSGD step counters, on every rank: set on the
    optimizer's compressor, or kept on the optimizer until
    RingAllreduceCallback gives it one (set_pending_powersgd_steps)."""
    from tfring import _core

    steps = np.zeros(0, np.int64)
    if arrays is not None and "powersgd.steps" in arrays:
        steps = np.asarray(arrays["powersgd.steps"], np.int64).reshape(-1)
    if basics.size() > 1:
        n = int(_core.broadcast(np.array([steps.size], np.int64), root=root,
                                name="tfring.keras.checkpoint.psgd_n")[0])
        if basics.rank() != root:
            steps = np.zeros(n, np.int64)
        if n:
            steps = _core.broadcast(steps, root=root,
                                    name="tfring.keras.checkpoint.psgd")
    opt = getattr(model, "optimizer", None)
    if not steps.size or opt is None:
        return
    psgd = attached(opt)
    if psgd is not None:
        psgd.set_step_counts([int(x) for x in steps])
    else:
        object.__setattr__(opt, "_tfring_powersgd_steps",
                           [int(x) for x in steps])


def set_pending_powersgd_steps(optimizer):
    """Hands step counters restored before fit to the optimizer's PowerSGD
    compressor, once it has one."""
    steps = getattr(optimizer, "_tfring_powersgd_steps", None)
    psgd = attached(optimizer)
    if steps is not None and psgd is not None:
        psgd.set_step_counts(steps)
        object.__delattr__(optimizer, "_tfring_powersgd_steps")


def _ensure_init():
    if not basics.is_initialized():
        basics.init()


class _ResumableCheckpoint:
    """Writes a checkpoint of the model's and optimizer's whole state from
    root_rank alone every `every_epochs` epochs (keeping the newest `keep`),
    and restores the newest one on every rank with restore(model) before
    fit; see tfring.keras.checkpoint."""

    def __init__(self, directory, every_epochs=1, keep=2, root_rank=0):
        # tfring is initialised on first use (set_model, restore,
        # on_epoch_end), not here: a callback rebuilt from its Keras config
        # off the ranks (the Spark driver) does not start the runtime.
        super().__init__()
        if every_epochs < 1 or keep < 1:
            raise ValueError("ResumableCheckpointCallback: every_epochs and "
                             "keep must be >= 1")
        self.directory = str(directory)
        self.every_epochs = int(every_epochs)
        self.keep = int(keep)
        self.root_rank = int(root_rank)

    def get_config(self):
        return {"directory": self.directory, "every_epochs": self.every_epochs,
                "keep": self.keep, "root_rank": self.root_rank}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def set_model(self, model):
        _ensure_init()
        super().set_model(model)

    def restore(self, model):
        """Collective; returns the initial_epoch for fit."""
        _ensure_init()
        return restore_checkpoint(model, self.directory, self.root_rank)

    def on_epoch_end(self, epoch, logs=None):
        _ensure_init()
        done = epoch + 1
        if done % self.every_epochs or basics.rank() != self.root_rank:
            return
        save_checkpoint(self.model, self.directory, done)
        for _, old in list_checkpoints(self.directory)[:-self.keep]:
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass
