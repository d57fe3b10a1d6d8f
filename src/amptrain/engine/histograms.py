"""`train.histogram_every = N`: weight and gradient histograms in TensorBoard every N steps.

    histograms = Histograms.from_config(config.train, job, trainer, scalars)   # None when off (0)
    histograms.write(step)

Weights are the model's trainable variables as they are. The training step keeps no
gradients (they live inside the graph call), so the gradients are computed afresh on the
first batch of the training stream (a stream of its own: the training order is not
touched), the same batch each time (one trace; histograms that differ only by the
weights), with the run's loss scale applied and removed, so fp16 gradients are not lost to underflow
in the histogram either; nothing is applied. On several replicas only the weights are
written (the gradient pass would need the strategy's step). Off (0), nothing runs.
"""


class Histograms:
    def __init__(self, every, model, loss_fn, dataset, loss_scale, scalars, gradients=True):
        self.every, self.model, self.loss_fn = every, model, loss_fn
        self.dataset, self.loss_scale, self.gradients = dataset, loss_scale, gradients
        self.scalars = scalars  # run_log.Scalars: its `train` writer
        self._batch = self._gradient_fn = None

    @classmethod
    def from_config(cls, train, job, trainer, scalars):
        """From the `[train]` section's `histogram_every`; None when it is 0."""
        every = train.histogram_every
        if not every:
            return None
        from amptrain import distribute

        single = distribute.is_single_device(trainer.strategy)
        return cls(every, job.model, job.loss_fn, job.train_dataset, trainer.loss_scale, scalars, single)

    def due(self, step):
        return step % self.every == 0

    def write(self, step):
        import tensorflow as tf

        writer = self.scalars.writer("train")
        with writer.as_default(step=step):
            for variable in self.model.trainable_variables:
                tf.summary.histogram("weights/" + variable.path, variable)
            if self.gradients:
                for variable, gradient in zip(self.model.trainable_variables, self._compute_gradients()):
                    if gradient is not None:
                        tf.summary.histogram("gradients/" + variable.path, gradient)
        writer.flush()

    def _compute_gradients(self):
        import tensorflow as tf

        if self._batch is None:  # one batch, kept: one trace, and histograms comparable over time
            self._batch = next(iter(self.dataset(0)))
            self._gradient_fn = tf.function(self._gradients)
        features, targets, _ = self._batch
        scale = self.loss_scale.scale if self.loss_scale is not None else tf.constant(1.0)
        return self._gradient_fn(features, targets, scale)

    def _gradients(self, features, targets, scale):
        import tensorflow as tf

        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            outputs = self.model(features, training=True)
            loss_sum, count = self.loss_fn(targets, outputs)
            loss = loss_sum / tf.maximum(count, 1.0) * scale
        gradients = tape.gradient(loss, variables)
        # an embedding's gradient is sparse (IndexedSlices): dense for the histogram
        return [None if g is None else tf.convert_to_tensor(g) / scale for g in gradients]
