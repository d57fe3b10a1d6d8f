"""The training step: N steps in one graph call, each step run on every replica.

    trainer = Trainer(strategy, model, optimizer, loss_fn, loss_scale=None, jit_compile=True)
    totals = trainer.train(iterator, num_steps=8)   # one graph call, 8 optimizer steps
    outputs = trainer.predict(dataset)              # list of numpy outputs, one per batch

The loss contract: `loss_fn(targets, outputs)` returns the sum of per-target losses and
the number of real targets on this replica. Both are all-reduced and divided, so the
update is the same for any replica count, padding, or token-level task.

Why the functions are split the way they are (each a pitfall met, see
docs/architecture.md): XLA cannot compile the op that pulls from a `tf.data` iterator,
so only the replica's forward and backward pass is jit-compiled and the multi-step loop
is an ordinary `tf.function`. A `tf.cond` around `optimizer.apply` inside a replica
context fails (the optimizer calls `merge_call`), so the skip decision for a
non-finite step is taken in the cross-replica context.
"""

import tensorflow as tf


class Trainer:
    def __init__(self, strategy, model, optimizer, loss_fn, loss_scale=None, jit_compile=False, clip_norm=0.0):
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.loss_scale = loss_scale
        self.clip_norm = clip_norm
        self.variables = list(model.trainable_variables)
        # Batches consumed, counted in the graph: a Ctrl-C that lands between a graph
        # call's return and Python's bookkeeping still checkpoints the right step.
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step", aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._forward_backward = tf.function(self._forward_backward_impl, jit_compile=jit_compile, reduce_retracing=True)
        self._predict_step = tf.function(self._predict_impl, jit_compile=jit_compile, reduce_retracing=True)
        self._train_loop = tf.function(self._train_loop_impl)
        self._predict_loop = tf.function(lambda features: self.strategy.run(self._predict_step, args=(features,)), reduce_retracing=True)

    # === Replica context ===

    def _forward_backward_impl(self, features, targets):
        scale = self.loss_scale.scale if self.loss_scale is not None else tf.constant(1.0)
        with tf.GradientTape() as tape:
            outputs = self.model(features, training=True)
            loss_sum, count = self.loss_fn(targets, outputs)
            # A per-replica mean keeps the gradients' magnitudes (and so the loss
            # scale) independent of batch size; _replica_step turns it into the
            # replica's share of the global mean.
            local_mean = loss_sum / tf.maximum(count, 1.0)
            scaled = local_mean * scale
        gradients = tape.gradient(scaled, self.variables)
        return loss_sum, count, gradients

    def _replica_step(self, features, targets, token_counts):
        context = tf.distribute.get_replica_context()
        loss_sum, count, gradients = self._forward_backward(features, targets)
        scale = self.loss_scale.scale if self.loss_scale is not None else tf.constant(1.0)
        global_loss_sum, global_count = context.all_reduce(tf.distribute.ReduceOp.SUM, [loss_sum, count])
        share = count / (tf.maximum(global_count, 1.0) * scale)
        gradients = [tf.convert_to_tensor(g) * share for g in gradients]
        # Summing here, not in the optimizer, gives every replica the global gradient:
        # its norm, its finiteness (one replica's inf makes the sum inf, so the skip
        # decision covers every replica) and the clipping all see the same values.
        gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in gradients])
        norm = tf.linalg.global_norm(gradients)
        if self.clip_norm > 0:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm, use_norm=norm)
        tokens = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(tf.cast(token_counts, tf.int64), axis=0))
        loss = global_loss_sum / tf.maximum(global_count, 1.0)
        return loss, finite, norm, tokens, gradients

    def _predict_impl(self, features):
        return self.model(features, training=False)

    # === Cross-replica context ===

    def _apply(self, gradients):
        self.optimizer.apply(gradients, self.variables)

    def _train_loop_impl(self, iterator, num_steps):
        loss_total = tf.constant(0.0)
        finite_steps = tf.constant(0, tf.int64)
        skipped = tf.constant(0, tf.int64)
        tokens = tf.zeros([2], tf.int64)  # real, padded
        norm = tf.constant(0.0)
        for _ in tf.range(num_steps):
            features, targets, token_counts = next(iterator)
            results = self.strategy.run(self._replica_step, args=(features, targets, token_counts))
            # After the all-reduces every replica holds the same values: read the first.
            local = lambda value: self.strategy.experimental_local_results(value)[0]  # noqa: E731
            loss, finite, step_norm, step_tokens = (local(v) for v in results[:4])
            gradients = [local(g) for g in results[4]]
            if self.loss_scale is not None:
                tf.cond(finite, lambda: self._apply(gradients), lambda: None)
                self.loss_scale.update(finite)
            else:
                self._apply(gradients)
            loss_total += tf.where(finite, loss, 0.0)
            finite_steps += tf.cast(finite, tf.int64)
            skipped += 1 - tf.cast(finite, tf.int64)
            tokens += step_tokens
            norm = step_norm
            self.step.assign_add(1)
        return {"loss_total": loss_total, "finite_steps": finite_steps, "skipped": skipped, "tokens": tokens, "grad_norm": norm}

    # === Eager entry points ===

    def train(self, iterator, num_steps):
        """Runs `num_steps` steps in one graph call; returns their totals as numpy values."""
        totals = self._train_loop(iterator, tf.constant(num_steps, tf.int64))
        return {key: value.numpy() for key, value in totals.items()}

    def predict(self, dataset):
        """Model outputs for each batch of a finite dataset of (features, targets, token_counts)."""
        outputs = []
        for features, _, _ in self.strategy.experimental_distribute_dataset(dataset):
            result = self._predict_loop(features)
            outputs.append(tf.nest.map_structure(lambda v: self.strategy.gather(v, axis=0).numpy(), result))
        return outputs
