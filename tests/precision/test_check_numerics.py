"""Check-numerics mode: the first NaN or inf stops the run with a diagnosis naming the op,
the Keras layer, the kind of value and the dtype; XLA is off for the run, and says so."""

import dataclasses
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import amptrain
from amptrain.config import Config, PrecisionConfig, RuntimeConfig
from amptrain.engine.run_log import read_metrics
from amptrain.errors import NumericsError
from amptrain.precision import check_numerics


@pytest.fixture
def checking():
    """Check-numerics on for one test and off after it, pass or fail (it is per thread
    and would otherwise slow down and change every later test in this process)."""
    tf.debugging.enable_check_numerics()
    yield
    check_numerics.disable()


@pytest.mark.slow
def test_a_diverging_run_stops_naming_the_op_and_the_layer_with_xla_off(tiny):
    # A learning rate of 1e30 moves every weight by about 1e30 in the first step (Adam's
    # step is about the learning rate), so the second forward pass squares ~1e30 in the
    # first layer norm's variance: a real +inf in float32, no layer patched.
    overrides = [
        "runtime.check_numerics=true",
        "runtime.jit_compile=true",
        "precision.policy=float32",
        "train.learning_rate=1e30",
    ]
    with pytest.raises(NumericsError) as caught:
        amptrain.fit(str(tiny / "tiny.toml"), overrides, run_dir=str(tiny / "run"))
    diagnosis = str(caught.value)
    print(diagnosis)
    tf_message = str(caught.value.__cause__)
    assert check_numerics.detected(caught.value.__cause__)
    assert 'graph op "SquaredDifference"' in tf_message
    assert diagnosis.splitlines()[0] == (
        "check-numerics: a float32 +inf came out of op SquaredDifference "
        "in layer block_0/attention_norm (LayerNormalization), forward pass"
    )
    assert "node classifier_1/block_0_1/attention_norm_1/moments/SquaredDifference" in diagnosis
    assert "amptrain/models/lean.py:" in diagnosis  # the line of the layer norm that made the variance

    run = read_metrics(tiny / "run" / "metrics.jsonl")[0]
    assert run["kind"] == "run" and run["jit_compile"] is False
    log = (tiny / "run" / "train.log").read_text()
    assert "check-numerics is on" in log and "XLA cannot compile the check-numerics ops" in log
    saved = (tiny / "run" / "config.toml").read_text()  # the config as the user gave it
    assert "jit_compile = true" in saved and "check_numerics = true" in saved
    # Off again after the run: a NaN in a new graph passes unchecked.
    assert np.isnan(tf.function(lambda: tf.math.log(tf.constant(-1.0)))().numpy())


@pytest.mark.slow
def test_a_healthy_run_finishes_in_check_numerics_mode(tiny):
    result = amptrain.fit(str(tiny / "tiny.toml"), ["runtime.check_numerics=true"], run_dir=str(tiny / "run"))
    assert result["test"]["examples"] == 32
    train = [r for r in read_metrics(tiny / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]


class Inner(keras.layers.Layer):
    def call(self, x):
        return tf.math.sqrt(x - 10.0)  # NaN for x < 10


class Outer(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = Inner(name="inner")

    def call(self, x):
        return self.inner(x * 2.0)


def raised(function, *args):
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        function(*args)
    return caught.value


def test_a_nested_layer_is_named_with_the_model_and_without_it(checking):
    inputs = keras.Input((3,))
    model = keras.Model(inputs, Outer(name="outer")(keras.layers.Dense(3, name="dense")(inputs)), name="net")
    error = raised(tf.function(lambda x: model(x)), tf.ones((2, 3)))
    with_model = check_numerics.explain(error, model).splitlines()
    assert (
        with_model[0] == "check-numerics: a float32 NaN came out of op Sqrt in layer outer/inner (Inner), forward pass"
    )
    assert with_model[1].startswith("  op: Sqrt, node net_1/outer_1/inner_1/Sqrt, output 0, graph ")
    assert "test_check_numerics.py:" in with_model[2]  # Inner.call
    # From the name scopes alone: the `_N` of each Keras call scope marks the layers.
    assert check_numerics.explain(error).splitlines()[0].endswith("in layer net/outer/inner, forward pass")


def test_a_layer_named_like_a_graph_suffix_is_told_apart(checking):
    # Keras names a second Dense `dense_1`, which is also the graph's name for `dense`'s
    # call scope (`dense_1` is called in `dense_1_2`): the overflow here is in `dense`.
    inputs = keras.Input((3,))
    x = keras.layers.Dense(3, name="dense", kernel_initializer=keras.initializers.Constant(2e38))(inputs)
    x = keras.layers.Dense(3, name="dense_1")(x)
    model = keras.Model(inputs, x, name="net")
    error = raised(tf.function(lambda x: model(x)), tf.ones((1, 3)))  # 3 * 2e38 > float32's 3.4e38
    lines = check_numerics.explain(error, model).splitlines()
    assert lines[0] == "check-numerics: a float32 +inf came out of op MatMul in layer dense (Dense), forward pass"
    assert lines[1].startswith("  op: MatMul, node net_1/dense_1/MatMul, ")


class Amplify(keras.layers.Layer):
    def call(self, x):
        return x * tf.constant(60000.0, x.dtype)  # 6e4: just inside float16's 65504


def test_a_float16_gradient_overflow_is_a_backward_pass_with_loss_scale_advice(checking):
    inputs = keras.Input((2,))
    model = keras.Model(inputs, Amplify(name="amplify", dtype="mixed_float16")(inputs), name="net")

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            # float32 loss, then x4: the gradient into `amplify` is 4 * 6e4, past float16's range.
            loss = tf.reduce_sum(tf.cast(model(x), tf.float32)) * 4.0
        return tape.gradient(loss, x)

    error = raised(gradient, tf.ones((1, 2)))
    lines = check_numerics.explain(error, model).splitlines()
    assert lines[0] == (
        "check-numerics: a float16 +inf came out of op Mul in layer amplify (Amplify), backward pass (a gradient)"
    )
    assert lines[1].startswith("  op: Mul, node gradient_tape/net_1/amplify_1/")
    assert "fixed precision.loss_scale" in lines[-1]


def test_an_eager_op_has_no_node_and_counts_every_kind_of_value(checking):
    error = raised(tf.math.log, tf.constant([-1.0, 0.0], tf.float16))
    lines = check_numerics.explain(error).splitlines()
    assert lines[0] == "check-numerics: a float16 -inf and NaN came out of op Log in no Keras layer"
    assert lines[1] == "  op: Log, node (name not given), output 0, run eagerly"


def test_other_invalid_arguments_are_not_check_numerics_failures():
    error = raised(tf.reshape, tf.zeros([3]), [2])
    assert not check_numerics.detected(error)
    assert not check_numerics.detected(ValueError("Detected Infinity or NaN"))


@pytest.fixture
def amptrain_log(caplog):
    """Records of the "amptrain" logger, which does not propagate to the root once a run
    has set up its logging."""
    logger = logging.getLogger("amptrain")
    propagate, logger.propagate = logger.propagate, True
    caplog.set_level(logging.INFO, logger="amptrain")
    yield caplog
    logger.propagate = propagate


def test_enable_turns_xla_off_and_says_why(amptrain_log):
    config = Config(runtime=RuntimeConfig(jit_compile=True, check_numerics=True, seed=7))
    try:
        changed = check_numerics.enable(config)
    finally:
        check_numerics.disable()
    assert changed.runtime == dataclasses.replace(config.runtime, jit_compile=False, fused_kernels=False)
    assert (changed.model, changed.train, changed.precision) == (config.model, config.train, config.precision)
    (message,) = [r.getMessage() for r in amptrain_log.records]
    assert "check-numerics is on" in message
    assert "XLA is off for this run (runtime.jit_compile = false): XLA cannot compile the check-numerics ops" in message


def test_enable_without_xla_says_nothing_of_it_and_warns_of_a_dynamic_fp16_scale(amptrain_log):
    config = Config(
        precision=PrecisionConfig(policy="mixed_float16"), runtime=RuntimeConfig(check_numerics=True, jit_compile=False)
    )
    try:
        # The layers' XLA kernels go off too; nothing is said of them.
        runtime = dataclasses.replace(config.runtime, fused_kernels=False)
        assert check_numerics.enable(config) == dataclasses.replace(config, runtime=runtime)
    finally:
        check_numerics.disable()
    messages = [r.getMessage() for r in amptrain_log.records]
    assert len(messages) == 2 and "XLA" not in messages[0]
    assert "dynamic loss scale's first overflow will stop the run" in messages[1]
