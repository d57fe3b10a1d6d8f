"""Dropout that draws half the random bits Keras's does: one 32-bit Philox word gives the
keep-or-drop decisions for two elements.

Keras's `Dropout` (TensorFlow's `stateless_dropout`) draws one uniform number per element,
in the input's dtype, each from a 32-bit Philox word. On a CPU the Philox kernel costs
about 4 ns a word on two cores (benchmarks/bf16_step_ops.py: `StatelessRandomUniformV2`
was 11% of a bf16 training step's op time at dropout 0.1, more than all the attention
products). Here each word is split into two 16-bit halves, and an element is dropped when
its half is below `round(rate * 65536)`: the drop probability is that count over 65536
(0.1 becomes 0.1000061; never more than 7.7e-6 from the rate) and the kept elements are scaled by
1 / (1 - that probability), so the expected output equals the input exactly, as Keras's.

The random draw (`StatelessRandomUniformFullIntV2`) is one op; the split, the comparison
and the scaling are elementwise ops that `runtime.jit_compile = "fusible"` compiles with
their neighbours. Stateless as Keras's: the layer's `SeedGenerator` (its state is in the
checkpoint) gives each call's seed, so a resumed run draws the same masks, and a block whose
activations are recomputed in the backward pass (`remat.py`) draws them again identically.
"""

import keras
import tensorflow as tf

RESOLUTION = 1 << 16  # the drop probability is a multiple of 1 / 65536


def drop_threshold(rate):
    """The 16-bit count below which an element is dropped, and the drop probability it gives."""
    count = min(max(int(round(rate * RESOLUTION)), 0), RESOLUTION)
    return count, count / RESOLUTION


def keep_mask(shape, rate, seed):
    """Bool tensor of `shape`: True where an element is kept, with probability 1 - rate (to
    1 / 65536). `seed`: an int32 tensor of shape (2,), as TensorFlow's stateless ops take."""
    count, _ = drop_threshold(rate)
    size = tf.reduce_prod(shape)
    words = tf.random.stateless_uniform(
        tf.reshape((size + 1) // 2, (1,)), seed, minval=None, maxval=None, dtype=tf.uint32
    )
    halves = tf.reshape(tf.bitcast(words, tf.uint16), (-1,))[:size]
    return tf.reshape(halves, shape) >= tf.constant(count, tf.uint16)


@keras.saving.register_keras_serializable(package="amptrain")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (same arguments, same config) drawing 16 random bits an element."""

    def call(self, inputs, training=False):
        if not training or self.rate <= 0:
            return inputs
        if self.noise_shape is not None:  # a broadcast mask is small: Keras's draw is cheap there
            return super().call(inputs, training=training)
        count, probability = drop_threshold(self.rate)
        if count == RESOLUTION:
            return tf.zeros_like(inputs)
        # The mask waits for the input: drawn when the input is ready, not held from the step's
        # start (a recomputed block's replay would otherwise draw its masks in the forward pass).
        with tf.control_dependencies([inputs]):
            seed = tf.identity(self._seed())
        keep = keep_mask(tf.shape(inputs), self.rate, seed)
        scaled = inputs * tf.cast(1.0 / (1.0 - probability), inputs.dtype)
        # A product, as TensorFlow's stateless_dropout: `tf.where(keep, scaled, zeros)` made
        # the "fusible" clustering build a cycle on static shapes (tests/engine/test_xla_modes.py).
        return scaled * tf.cast(keep, inputs.dtype)

    def _seed(self):
        """This call's seed, from the layer's generator (which a recomputed block replays:
        `remat.py`)."""
        seed = self.seed_generator.next()
        if seed.dtype != tf.int32:  # as Keras's TensorFlow backend: its seed variable is int64
            seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
        return seed
