"""A user's loss and metrics for `amptrain.Trainer`, in the engine's terms.

    loss_fn = as_loss(keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss_sum, count = loss_fn({"y": labels, "w": weights}, outputs)   # float32, over this replica's rows
    metrics = as_metrics(["accuracy"])       # [(name, () -> fresh keras.metrics.Metric)]

The loss is reduced as the built-in tasks' is: the engine all-reduces the sum and the count
and divides, so the update is the mean over the *global* batch, whatever the replica count,
and a row (or target) of weight 0 adds nothing to either. A Keras loss object gives
per-target values (`loss.call`, before its own reduction); a callable
`(targets, outputs) -> (loss sum, count)` is taken as it is.
"""

from amptrain.errors import UserError


def as_loss(loss):
    """The engine's `(targets, outputs) -> (sum, count)` for a Keras loss or such a callable."""
    import keras
    import tensorflow as tf

    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            raise UserError(f"loss: Keras knows no loss {loss!r}") from None
    if isinstance(loss, keras.losses.Loss):
        return _KerasLoss(loss)
    if callable(loss):

        def own(targets, outputs):
            total, count = loss(targets["y"], outputs)
            return tf.cast(total, tf.float32), tf.cast(count, tf.float32)

        return own
    raise UserError(
        f"loss: expected a keras.losses.Loss or a callable (targets, outputs) -> (sum, count), received {loss!r}"
    )


class _KerasLoss:
    def __init__(self, loss):
        self.loss = loss

    def __call__(self, targets, outputs):
        import tensorflow as tf

        # float32: a sum over the batch's targets in half precision loses the small ones.
        outputs = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)
        values = tf.cast(self.loss.call(targets["y"], outputs), tf.float32)  # per target, unreduced
        weights = targets["w"]
        weights = tf.reshape(
            weights, tf.concat([tf.shape(weights), tf.ones([tf.rank(values) - tf.rank(weights)], tf.int32)], 0)
        )
        weights = tf.broadcast_to(weights, tf.shape(values))
        return tf.reduce_sum(values * weights), tf.reduce_sum(weights)


def check_loss(loss_fn, targets, outputs):
    """Refuses a loss that gives no (scalar sum, scalar count) on a real batch, in one line."""
    try:
        total, count = loss_fn(targets, outputs)
    except Exception as error:  # the user's loss on the user's batch: any failure is theirs
        raise UserError(f"loss: it fails on the model's outputs for the first training batch: {_line(error)}") from None
    if total.shape.rank != 0 or count.shape.rank != 0:
        raise UserError(
            f"loss: expected per-target values that sum to a scalar, received a sum of shape {total.shape.as_list()} "
            f"(targets {_shapes(targets['y'])}, outputs {_shapes(outputs)})"
        )


def as_metrics(metrics):
    """[(name, make)]: each metric under the name it was given, `make()` a fresh Keras metric."""
    import keras

    resolved = []
    for metric in metrics or ():
        if isinstance(metric, str):
            name = metric
            if metric in ("accuracy", "acc"):
                resolved.append((name, None))  # chosen from the shapes (`pick_accuracy`), as Keras' compile does
                continue
            try:
                found = keras.metrics.get(metric)
            except ValueError:
                raise UserError(f"metrics: Keras knows no metric {metric!r}") from None
        else:
            found = metric
            name = getattr(metric, "name", None) or getattr(metric, "__name__", repr(metric))
        resolved.append((name, _maker(found, name)))
    return resolved


def _maker(found, name):
    import copy

    import keras

    if isinstance(found, keras.metrics.Metric):
        return lambda: copy.deepcopy(found)
    if isinstance(found, type) and issubclass(found, keras.metrics.Metric):
        return found
    if callable(found):
        return lambda: keras.metrics.MeanMetricWrapper(found, name=name)
    raise UserError(f"metrics: expected Keras metric names or objects, received {found!r}")


def pick_accuracy(targets, outputs):
    """The accuracy Keras' compile would pick for "accuracy" from these shapes."""
    import keras

    if len(outputs.shape) == len(targets.shape) + 1 and outputs.shape[-1] != 1:
        return keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    if outputs.shape[-1] == 1 or len(outputs.shape) == 1:
        return keras.metrics.BinaryAccuracy(name="accuracy")
    return keras.metrics.CategoricalAccuracy(name="accuracy")


def _shapes(structure):
    import tensorflow as tf

    return [t.shape.as_list() for t in tf.nest.flatten(structure)]


def _line(error):
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
