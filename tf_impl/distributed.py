"""Data-parallel training on TensorFlow's own engine: ``tf.distribute.MirroredStrategy`` over
``workers`` replicas in one process (on a CPU, as many logical CPU devices,
`tf.config.set_logical_device_configuration`); mirrored name for name by
`torch_impl.distributed` (DDP over gloo, one process per worker).

    init_workers(2)                                       # 2 logical CPUs (before TF starts)
    agree({...})                                          # one process: nothing to disagree with
    parallel = DataParallel(config, weights, workers=2)   # variables mirrored on both
    parallel.make_optimizer(warmup=400)                   # KingmaBaAdam + Noam, under the strategy
    for step in ...:
        loss, lr = parallel.train_step(global_batch)      # replica r takes rows [r*b, (r+1)*b)

Each replica computes on its rows of the same global batch (`shared.data_parallel.shard_rows`) and
divides its summed loss by the global batch's non-padding target count; Keras' TF optimizer
all-reduces the replicas' gradients with SUM before its update (``_all_reduce_sum_gradients``), and
`KingmaBaAdam` then updates every replica's copy of each variable with the same numbers. So the
update equals the one-process update on the whole batch, up to the order of the additions (the
same rule as torch_impl; `shared.data_parallel` says why the global count matters). On CPU
devices MirroredStrategy reduces on one device (``ReductionToOneDevice``), which takes float64.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf

from shared import TransformerConfig
from shared.data_parallel import TIMEOUT_S, check_timeout, check_worker_count, check_workers, disagreement
from shared.loss import check_smoothing

from .model import Transformer, _traced
from .training import _IDS, StepResult, _batch, _check_rate, _loss, make_optimizer


def logical_cpus(workers: int) -> list[str]:
    """The names of ``workers`` logical CPU devices, splitting the first physical CPU into that many
    if TensorFlow has not started yet. TensorFlow fixes its devices when its runtime starts: asked
    for more than it then made, this raises a ``ValueError`` saying so, rather than running on fewer.
    """
    check_worker_count(workers)
    cpu = tf.config.list_physical_devices("CPU")[0]
    have = tf.config.get_logical_device_configuration(cpu)
    if workers > 1 and (have is None or len(have) < workers):
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(workers)])
        except RuntimeError:
            made = len(tf.config.list_logical_devices("CPU"))
            raise ValueError(f"workers: expected {workers} logical CPU devices, got {made}: TensorFlow "
                             "had already started in this process with that many; create the "
                             "DataParallel (or call logical_cpus) before anything else runs "
                             "TensorFlow") from None
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < workers:
        raise ValueError(f"workers: expected {workers} logical CPU devices, got {len(devices)}")
    return devices[:workers]


_STRATEGIES: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def _strategy(devices: tuple[str, ...]) -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy per set of devices and process: a second one over the same devices
    numbers its collective operations from the same start, and TensorFlow then aborts them ("expected
    data_type 1 but got data_type 2") when the two strategies' programs reduce different dtypes."""
    if devices not in _STRATEGIES:
        _STRATEGIES[devices] = tf.distribute.MirroredStrategy(list(devices))
    return _STRATEGIES[devices]


def init_workers(workers: int | None = None, timeout: float = TIMEOUT_S) -> tuple[int, int]:
    """As torch_impl's: ``(rank, workers)``, here ``(0, workers)``: one process holds every replica.
    Splits the CPU into ``workers`` logical devices (`logical_cpus`), so call it before anything
    else runs TensorFlow. ``timeout``: for the mirror; replicas of one process cannot wait on a
    peer that died; checked as there."""
    check_timeout(timeout)
    workers = 1 if workers is None else workers
    logical_cpus(workers)
    return 0, workers


def agree(description: Mapping | BaseException) -> None:
    """As torch_impl's: raises the error given, else returns (one process: nothing to differ)."""
    if isinstance(description, BaseException):
        raise description
    disagreement([dict(description)])


def broadcast(value: float) -> float:
    """As torch_impl's: one process, so ``value`` itself."""
    return float(value)


def largest(value: int) -> int:
    """As torch_impl's: one process, so ``value`` itself."""
    return int(value)


def close() -> None:
    """As torch_impl's: nothing to leave."""


class DataParallel:
    """A `Transformer` trained data-parallel by ``tf.distribute.MirroredStrategy``.

    Args:
        config, weights: the model and its canonical weights (built under the strategy's scope:
            every variable is mirrored on every replica).
        workers: the number of replicas (logical CPU devices, `logical_cpus`); None = 1.
        timeout: accepted for the mirror with torch_impl; replicas of one process cannot wait on
            a peer that died, so there is nothing to time out.

    Attributes: ``model``, ``rank`` (0: one process), ``workers``, ``strategy``, ``optimizer``
    (after `make_optimizer`).
    """

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                 workers: int | None = None, timeout: float = TIMEOUT_S):
        self.rank, self.workers = init_workers(workers, timeout)
        self.strategy = _strategy(tuple(logical_cpus(self.workers)))
        with self.strategy.scope():
            self.model = Transformer(config)
        self.model.import_weights(weights)  # assigns every replica's copy
        self.optimizer, self._steps = None, {}

    def make_optimizer(self, warmup: int = 4000, factor: float = 1.0, start_step: int = 0):
        """`tf_impl.training.make_optimizer` under the strategy's scope (mirrored slots)."""
        with self.strategy.scope():
            self.optimizer = make_optimizer(self.model, warmup=warmup, factor=factor,
                                            start_step=start_step)
        self._steps = {}
        return self.optimizer

    def _compiled_step(self, smoothing: float):
        """One ``tf.function`` per smoothing, traced once for every batch shape: ``strategy.run``
        of the replica step, then the replicas' losses summed. Made again when the model's
        structure changes (`tf_impl.model._structure`), as `tf_impl.training.train_step`'s."""
        return _traced(self._steps, smoothing, self.model, lambda: self._make_step(smoothing))

    def _make_step(self, smoothing: float):
        """The ``tf.function`` of `_compiled_step`, new."""
        model, optimizer, strategy, workers = self.model, self.optimizer, self.strategy, self.workers
        pad_id = model.config.pad_id

        def replica_step(src, tgt_in, tgt_out, tokens):
            rank = tf.distribute.get_replica_context().replica_id_in_sync_group
            per = tf.shape(src)[0] // workers
            rows = slice(rank * per, (rank + 1) * per)  # shared.data_parallel.shard_rows
            variables = model.trainable_variables
            with tf.GradientTape() as tape:
                loss = _loss(model, src[rows], tgt_in[rows], tgt_out[rows], smoothing, True, tokens)
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            lr = tf.cast(optimizer.learning_rate, tf.float64)  # read before apply advances iterations
            optimizer.apply_gradients(zip(grads, variables))  # Keras sums the replicas' gradients
            return loss, lr

        @tf.function(input_signature=[_IDS, _IDS, _IDS], autograph=False)
        def step(src, tgt_in, tgt_out):
            tokens = tf.reduce_sum(tf.cast(tgt_out != pad_id, tf.int64))  # the global count
            losses, lrs = strategy.run(replica_step, args=(src, tgt_in, tgt_out, tokens))
            return (strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None),
                    strategy.experimental_local_results(lrs)[0])

        return step

    def train_step(self, batch, smoothing: float = 0.0) -> StepResult:
        """One update on the global ``batch = (src (B, S), tgt_in (B, T), tgt_out (B, T))``
        (``B`` a multiple of the workers); replica ``r`` computes on its rows.

        Returns ``StepResult(loss, lr)``: the global batch's loss before the update (the replicas'
        shares summed) and the learning rate of this step.
        """
        if self.optimizer is None:
            raise ValueError("optimizer: call make_optimizer before train_step")
        check_smoothing(smoothing)  # before tracing: a Python constant of the compiled step
        _check_rate(self.optimizer)  # a rate set after make_optimizer: as one process's step checks it
        src, tgt_in, tgt_out = _batch(self.model, batch)  # checks the global batch, as one process does
        check_workers(int(src.shape[0]), self.workers, "workers")
        loss, lr = self._compiled_step(float(smoothing))(src, tgt_in, tgt_out)
        return StepResult(float(loss.numpy()), float(lr.numpy()))
