"""amptrain's Dropout: 16 random bits an element, Keras's expectation and config."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from amptrain import xla_modes
from amptrain.models.dropout import Dropout, drop_threshold, keep_mask
from amptrain.models.islands import float32_island


def test_threshold_is_the_rate_counted_in_65536ths():
    assert drop_threshold(0.1) == (6554, 6554 / 65536)  # 6553.6 rounds up: 0.1000061
    assert drop_threshold(0.0) == (0, 0.0)
    assert drop_threshold(1.0) == (65536, 1.0)
    for rate in np.linspace(0, 1, 101):
        assert abs(drop_threshold(rate)[1] - rate) <= 0.5 / 65536


def test_drops_the_rate_and_keeps_the_expectation():
    layer = Dropout(0.25, seed=7)
    x = tf.ones((200, 501))  # an odd count: the last word's second half is unused
    out = layer(x, training=True).numpy()
    dropped = (out == 0).mean()
    # binomial(100,200, 0.25): standard deviation 0.0014
    assert abs(dropped - 0.25) < 0.006
    kept = out[out != 0]
    np.testing.assert_allclose(kept, 1 / (1 - 0.25), rtol=1e-6)
    assert abs(out.mean() - 1.0) < 0.01


def test_masks_are_independent_across_elements_and_calls():
    layer = Dropout(0.5, seed=1)
    x = tf.ones((64, 1000))
    first = layer(x, training=True).numpy() != 0
    second = layer(x, training=True).numpy() != 0
    assert 0.45 < (first != second).mean() < 0.55  # a new seed each call
    # the two halves of one 32-bit word decide neighbouring elements: uncorrelated
    flat = first.reshape(-1)
    agree = (flat[0::2] == flat[1::2]).mean()
    assert 0.48 < agree < 0.52


def test_same_seed_same_mask_and_identity_outside_training():
    x = tf.reshape(tf.range(1, 3001, dtype=tf.float32), (3, 1000))
    a = Dropout(0.3, seed=5)(x, training=True).numpy()
    b = Dropout(0.3, seed=5)(x, training=True).numpy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(Dropout(0.3, seed=5)(x, training=False).numpy(), x.numpy())
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True).numpy(), x.numpy())
    np.testing.assert_array_equal(Dropout(1.0, seed=5)(x, training=True).numpy(), np.zeros((3, 1000)))


def test_keep_mask_takes_a_dynamic_shape():
    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.float32)])
    def mask(x):
        return keep_mask(tf.shape(x), 0.5, tf.constant([3, 4], tf.int32))

    for shape in ((1, 1), (3, 7), (16, 129)):
        assert mask(tf.zeros(shape)).shape == shape


@pytest.mark.parametrize("mode", [True, "fusible"])
def test_xla_draws_the_same_mask(mode):
    x = tf.ones((8, 33, 17), tf.bfloat16)
    outputs = {}
    for each in (False, mode):
        layer = Dropout(0.1, seed=3, dtype="mixed_bfloat16")

        @tf.function(jit_compile=xla_modes.whole(each))
        def step(x, layer=layer, each=each):
            with xla_modes.scope(each):
                return layer(x, training=True)

        outputs[each] = step(x).numpy().astype(np.float32)
    np.testing.assert_array_equal(outputs[False], outputs[mode])


def test_config_round_trip_and_float32_island_registration():
    layer = float32_island(Dropout(0.2, seed=3, dtype="float32", name="head_dropout"), "follows float32")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, layer(inputs))
    restored = keras.Model.from_config(model.get_config())
    head = restored.get_layer("head_dropout")
    assert isinstance(head, Dropout) and head.float32_reason == "follows float32" and head.rate == 0.2
    assert keras.saving.get_registered_name(type(head)) == "amptrain>float32_island.amptrain.Dropout"
    assert keras.saving.get_registered_name(type(float32_island(keras.layers.Dropout(0.1), "r"))) == (
        "amptrain>float32_island.Dropout"  # a model saved before amptrain had its own Dropout still loads
    )
