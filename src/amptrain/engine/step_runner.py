"""The training step: N steps in one graph call, each step run on every replica.

    trainer = StepRunner(strategy, model, optimizer, loss_fn, loss_scale=None, jit_compile=True)
    # (engine.build.build_training builds one from a config, as `fit` and `bench` do)
    totals = trainer.train(iterator, num_steps=8)   # one graph call, up to 8 steps
    outputs = trainer.predict(dataset)              # list of numpy outputs, one per batch

The loss contract: `loss_fn(targets, outputs)` returns the sum of per-target losses and
the number of real targets on this replica. Both are all-reduced and divided, so the
update is the same for any replica count, padding, or token-level task.

Accumulation: with `accumulation_steps` K, a step runs K micro-batches through the
forward and backward pass, sums their (unscaled) gradients and losses, and applies one
update: the mean over the real targets of all K micro-batches on all replicas, equal to
one step on a K-times-larger batch. The skip decision and the loss scaler see the
accumulated gradients.

Skipping: a step is applied only if its loss and its all-reduced gradients are finite.
A skipped step changes no weight, no optimizer slot, no weight average and not the optimizer's iteration
count (so not the learning-rate schedule either), but it consumes its batch: `step`
counts batches, so the data position and resume stay exact. The graph call returns
early (and says why in `stop`) when the run cannot go on: an overflow with the loss
scale at its floor, `max_consecutive_skips` skipped steps in a row, or a non-finite
loss when the NaN policy is not "skip". Everything the loop reports is computed in the
graph, so it holds for any `steps_per_execution` and under XLA.

Why the functions are split the way they are (each a pitfall met, see
docs/architecture.md): XLA cannot compile the op that pulls from a `tf.data` iterator,
so the multi-step loop is an ordinary `tf.function` that pulls each step's batches and
hands them to `_step_fn`. On one device with `jit_compile` (`fused`), `_step_fn` is one XLA
cluster: forward and backward, reduce, skip decision, optimizer update, loss scaler,
counters. Under several replicas only the replica's forward and backward pass is
jit-compiled: their replicas meet in `merge_call`, which XLA cannot compile. Under
`jit_compile = "fusible"` nothing is compiled whole: XLA compiles the ops of the forward
and backward pass between their matrix products (xla_modes.py). A
`tf.cond` around `optimizer.apply` inside a replica context fails (the optimizer calls
`merge_call`), so the skip decision is taken in the cross-replica context (on one
device, inside the compiled step).
"""

import gc
from typing import NamedTuple

import tensorflow as tf

from amptrain import xla_modes
from amptrain.distribute import is_single_device
from amptrain.engine.utilisation import return_free_pages

# Why a graph call stopped early (the `stop` total).
RUNNING, SCALE_AT_FLOOR, TOO_MANY_SKIPS, NONFINITE_LOSS = 0, 1, 2, 3


class StepResult(NamedTuple):
    """One step's numbers, as the graph computes them (tensors)."""

    loss: object  # the global mean loss
    applied: object  # the update was applied (loss and gradients finite)
    grads_finite: object
    nonfinite: object  # what the NaN policy acts on
    variable_finite: object  # (variables,) bool: each variable's gradient finite (the overflow locator)
    norm: object  # the global gradient norm
    sizes: object  # (real tokens, padded tokens, rows with a real token)
    scale: object  # the loss scale it ran with
    stop: object  # RUNNING, or why the call stops


class StepRunner:
    def __init__(
        self,
        strategy,
        model,
        optimizer,
        loss_fn,
        *,
        loss_scale=None,
        jit_compile=False,
        fused_kernels=False,
        clip_norm=0.0,
        max_consecutive_skips=0,
        stop_on_nonfinite_loss=True,
        accumulation_steps=1,
        weight_average=None,
        fuse_step=True,
    ):
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.loss_scale = loss_scale
        self.clip_norm = clip_norm
        self.max_consecutive_skips = max_consecutive_skips  # 0: no limit
        self.stop_on_nonfinite_loss = stop_on_nonfinite_loss
        self.accumulation_steps = accumulation_steps
        self.weight_average = weight_average  # engine.averaging.WeightAverage, updated after each applied step
        self.variables = list(model.trainable_variables)
        # Counted in the graph and checkpointed: a Ctrl-C that lands between a graph
        # call's return and Python's bookkeeping still saves the right numbers.
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA

        def counter(name):
            return tf.Variable(0, dtype=tf.int64, trainable=False, name=name, aggregation=aggregation)

        self.step = counter("step")  # batches consumed, skipped or not
        self.skipped_steps = counter("skipped_steps")
        self.consecutive_skips = counter("consecutive_skips")
        # Public for benchmarks/step_profile.py. "fusible": its ops but the matrix products
        # are built in an XLA scope; `fused_kernels`: the layers' kernels (xla_modes.py).
        self.jit_mode, self.fused_kernels = jit_compile, fused_kernels
        whole = xla_modes.whole(jit_compile)
        # One replica (the default strategy, OneDeviceStrategy) has no merge_call across
        # replica threads, so XLA can compile the whole step after the iterator pull:
        # forward, backward, reduce, skip decision, AdamW's update, scaler and counters.
        self.fused = bool(fuse_step and whole) and is_single_device(strategy)
        self._training_functions()
        self._predict_step = tf.function(self._predict_impl, jit_compile=whole, reduce_retracing=True, autograph=False)
        self._predict_loop = tf.function(self._predict_loop_impl, reduce_retracing=True, autograph=False)

    def _training_functions(self):
        # No AutoGraph in the trainer (docs/architecture.md, "No AutoGraph in the trainer"):
        # converting the step from its source cost ~1.7 s of a 7 s tiny fit in every process.
        whole = xla_modes.whole(self.jit_mode)
        self.forward_backward = tf.function(
            self._forward_backward_impl, jit_compile=whole, reduce_retracing=True, autograph=False
        )
        self._step_fn = self._step_into_totals
        if self.fused:
            self._step_fn = tf.function(
                self._step_into_totals, jit_compile=True, reduce_retracing=True, autograph=False
            )
        self._train_loop = tf.function(self._train_loop_impl, autograph=False)

    def release_training(self):
        """Drops the training call's traced and instantiated graphs, for a run whose steps are
        over (before its last dev evaluation and its final test): TensorFlow keeps a function's
        executable graph while the function lives, ~170 MiB of SmolLM2's LoRA step beside its
        generated replies. A later `train` traces again."""
        self._training_functions()
        gc.collect()  # a traced function's graph is held in reference cycles
        return_free_pages()

    def counters(self):
        """The trackables a checkpoint must hold besides the model and optimizer."""
        return {"step": self.step, "skipped_steps": self.skipped_steps, "consecutive_skips": self.consecutive_skips}

    # === Replica context ===

    def current_scale(self):
        return self.loss_scale.scale.read_value() if self.loss_scale is not None else tf.constant(1.0)

    def _forward_backward_impl(self, features, targets, scale):
        with xla_modes.scope(self.jit_mode, self.fused_kernels):
            with tf.GradientTape() as tape:
                outputs = self.model(features, training=True)
                loss_sum, count = self.loss_fn(targets, outputs)
                # A per-replica mean keeps the gradients' magnitudes (and so the loss
                # scale) independent of batch size; _replica_micro_batch turns it back into sums.
                local_mean = loss_sum / tf.maximum(count, 1.0)
                scaled = local_mean * scale
            gradients = tape.gradient(scaled, self.variables)
            # Dense here, not in the caller: an embedding's gradient is an IndexedSlices
            # whose `dense_shape` would leave this function as an output, and XLA needs it as
            # a compile-time constant to densify it; a constant that comes out of a function
            # call makes XLA treat every input of that call (the batch, every weight) as a
            # constant, so the fused step would recompile on every call.
            return loss_sum, count, [tf.convert_to_tensor(g) for g in gradients]

    def _replica_micro_batch(self, features, targets, token_counts, scale, *accumulated):
        """One micro-batch on this replica: its loss sum, target count, the unscaled
        gradient of its loss *sum* (float32), and its `sizes` (real tokens, padded tokens,
        rows with a real token); added to `accumulated` (the same four) when given."""
        loss_sum, count, gradients = self.forward_backward(features, targets, scale)
        gradients = [g * (count / scale) for g in gradients]
        token_counts = tf.cast(token_counts, tf.int64)
        rows = tf.reduce_sum(tf.cast(token_counts[:, 0] > 0, tf.int64), keepdims=True)
        sizes = tf.concat([tf.reduce_sum(token_counts, axis=0), rows], axis=0)
        if not accumulated:
            return loss_sum, count, gradients, sizes
        previous_sum, previous_count, previous_gradients, previous_sizes = accumulated
        gradients = [a + g for a, g in zip(previous_gradients, gradients)]
        return previous_sum + loss_sum, previous_count + count, gradients, previous_sizes + sizes

    def _replica_reduce(self, loss_sum, count, gradients, sizes):
        """The global mean gradient of the step, from every replica's sums."""
        context = tf.distribute.get_replica_context()
        global_loss_sum, global_count = context.all_reduce(tf.distribute.ReduceOp.SUM, [loss_sum, count])
        # Summing here, not in the optimizer, gives every replica the global gradient:
        # its norm, its finiteness (one replica's inf makes the sum inf, so the skip
        # decision covers every replica) and the clipping all see the same values.
        gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        gradients = [g / tf.maximum(global_count, 1.0) for g in gradients]
        # One flag a variable: the overflow locator's evidence, and their AND is the
        # step's finiteness, so the locator costs nothing extra.
        variable_finite = tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in gradients])
        norm = tf.linalg.global_norm(gradients)
        if self.clip_norm > 0:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm, use_norm=norm)
        sizes = context.all_reduce(tf.distribute.ReduceOp.SUM, sizes)
        loss = global_loss_sum / tf.maximum(global_count, 1.0)
        return loss, variable_finite, norm, sizes, gradients

    def _predict_impl(self, features):
        # No kernels: an evaluation's numbers are those of `predict` and the exported model.
        with xla_modes.scope(self.jit_mode):
            return self.model(features, training=False)

    def _predict_replica(self, features):
        # A plain function, not the compiled one, goes to `strategy.run`: given a
        # jit-compiled `tf.function`, MirroredStrategy (on anything but all-GPU devices)
        # clones it around *all* the replicas' calls, so one XLA cluster placed on the
        # first device reads the other replicas' variables ("Trying to access resource
        # .../replica_1 located in device CPU:1 from device CPU:0"). Called from here,
        # each replica runs its own compiled call on its own device, like `_replica_micro_batch`.
        return self._predict_step(features)

    # === Cross-replica context ===

    def apply_gradients(self, gradients):
        """The optimizer's update and the weight average's (cross-replica context)."""
        self.optimizer.apply(gradients, self.variables)
        if self.weight_average is not None:
            self.weight_average.update()

    def _update(self, batches):
        """Runs one step on its `accumulation_steps` micro-batches and applies it if finite;
        returns its numbers and why to stop."""
        scale = self.current_scale()
        accumulated = ()
        for features, targets, token_counts in batches:  # unrolled: K is small, and each call is the same function
            accumulated = self.strategy.run(
                self._replica_micro_batch, args=(features, targets, token_counts, scale, *accumulated)
            )
        results = self.strategy.run(self._replica_reduce, args=accumulated)
        # After the all-reduces every replica holds the same values: read the first.
        local = lambda value: self.strategy.experimental_local_results(value)[0]  # noqa: E731
        loss, variable_finite, norm, sizes = (local(v) for v in results[:4])
        gradients = [local(g) for g in results[4]]
        loss_finite = tf.math.is_finite(loss)
        grads_finite = tf.reduce_all(variable_finite)
        applied = tf.logical_and(loss_finite, grads_finite)
        tf.cond(applied, lambda: self.apply_gradients(gradients), lambda: None)
        at_floor = (
            self.loss_scale.update(loss_finite, grads_finite) if self.loss_scale is not None else tf.constant(False)
        )
        self.skipped_steps.assign_add(1 - tf.cast(applied, tf.int64))
        self.consecutive_skips.assign(tf.where(applied, tf.constant(0, tf.int64), self.consecutive_skips + 1))
        # Without a scaler there is nothing to back off: non-finite gradients are the NaN policy's.
        nonfinite = tf.logical_not(loss_finite if self.loss_scale is not None else applied)
        too_many = self.max_consecutive_skips > 0 and self.consecutive_skips >= self.max_consecutive_skips
        stop = tf.where(at_floor, SCALE_AT_FLOOR, tf.where(too_many, TOO_MANY_SKIPS, RUNNING))
        if self.stop_on_nonfinite_loss:
            stop = tf.where(tf.logical_and(nonfinite, stop == RUNNING), NONFINITE_LOSS, stop)
        self.step.assign_add(1)
        return StepResult(loss, applied, grads_finite, nonfinite, variable_finite, norm, sizes, scale, stop)

    def _train_loop_impl(self, iterator, num_steps):
        totals = {
            "loss_total": tf.constant(0.0),
            "applied_steps": tf.constant(0, tf.int64),
            "overflow_steps": tf.constant(0, tf.int64),
            "nonfinite_steps": tf.constant(0, tf.int64),
            "tokens": tf.zeros([2], tf.int64),  # real, padded
            "examples": tf.constant(0, tf.int64),  # rows: a token batch's vary by bucket
            "grad_norm": tf.constant(0.0),  # of the last applied step (not NaN: check-numerics would stop on it)
            "stop": tf.constant(RUNNING),
            # The first overflow of the call: its step, the scale it ran with, and which
            # variables' gradients were non-finite.
            "overflow_step": tf.constant(-1, tf.int64),
            "overflow_scale": tf.constant(0.0),
            "overflow_variables": tf.zeros([len(self.variables)], tf.bool),
        }

        def more(done, totals):
            return tf.logical_and(done < num_steps, totals["stop"] == RUNNING)

        def step(done, totals):
            batches = [next(iterator) for _ in range(self.accumulation_steps)]
            return done + 1, self._step_fn(totals, batches)

        _, totals = tf.while_loop(more, step, (tf.constant(0, tf.int64), totals))
        return totals

    def _step_into_totals(self, totals, batches):
        """One step on its pulled micro-batches, added to the call's totals: under XLA as
        one cluster when `fused`, else in the loop's graph."""
        return _add_to_totals(totals, self._update(batches), self.step.read_value())

    def _predict_loop_impl(self, features):
        result = self.strategy.run(self._predict_replica, args=(features,))
        return tf.nest.map_structure(lambda v: self.strategy.gather(v, axis=0), result)

    # === Eager entry points ===

    def train(self, iterator, num_steps):
        """Runs up to `num_steps` steps in one graph call (fewer when `stop` says why);
        returns their totals as numpy values. `self.step` tells how far it got."""
        totals = self._train_loop(iterator, tf.constant(num_steps, tf.int64))
        return {key: value.numpy() for key, value in totals.items()}

    def train_graph(self, iterator, num_steps):
        """The graph of the training call (already traced for these arguments), for TensorBoard."""
        return self._train_loop.get_concrete_function(iterator, tf.constant(num_steps, tf.int64)).graph

    def predict(self, dataset):
        """Model outputs for each batch of a finite dataset of (features, targets, token_counts)."""
        from amptrain.distribute import distribute_batches
        from amptrain.engine.run_log import Progress

        outputs = []
        # A line on a terminal (eval, predict, the dev score) once it has taken 2 s.
        progress = Progress(max(int(dataset.cardinality()), 0), 0, unit="batch", after=2.0)
        # Replica r predicts slice r of each batch; gathering in replica order rebuilds the batch.
        for features, _, _ in distribute_batches(self.strategy, lambda: dataset):
            outputs.append(tf.nest.map_structure(lambda v: v.numpy(), self._predict_loop(features)))
            progress.show(len(outputs), "predicting")
        progress.clear()
        return outputs


def _add_to_totals(totals, step, step_number):
    """The call's totals with one more step (a `StepResult`)."""
    overflow = tf.logical_not(step.grads_finite)
    first_overflow = tf.logical_and(overflow, totals["overflow_step"] < 0)
    return {
        "loss_total": totals["loss_total"] + tf.where(step.applied, step.loss, 0.0),
        "applied_steps": totals["applied_steps"] + tf.cast(step.applied, tf.int64),
        "overflow_steps": totals["overflow_steps"] + tf.cast(overflow, tf.int64),
        "nonfinite_steps": totals["nonfinite_steps"] + tf.cast(step.nonfinite, tf.int64),
        "tokens": totals["tokens"] + step.sizes[:2],
        "examples": totals["examples"] + step.sizes[2],
        "grad_norm": tf.where(step.applied, step.norm, totals["grad_norm"]),
        "stop": step.stop,
        "overflow_step": tf.where(first_overflow, step_number, totals["overflow_step"]),
        "overflow_scale": tf.where(first_overflow, step.scale, totals["overflow_scale"]),
        "overflow_variables": tf.where(
            first_overflow, tf.logical_not(step.variable_finite), totals["overflow_variables"]
        ),
    }
