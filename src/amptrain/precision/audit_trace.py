"""Tracing a model for the precision audit (`precision/audit.py`): its layers by path,
one training-mode trace of the model and the loss on its outputs, and the layer each
op of that graph ran in.

    layers = layer_tree(model)                       # {"block_0/attention": layer, ...}
    graph, outputs, losses = trace(model, inputs, loss_fn, targets)
    locate = locator(model, layers)
    locate(op.name)                                  # "block_0/attention", the model's name or "loss"

An op is mapped to a layer by the name scopes it ran in, not by the layer's class or
name, so what is found is what runs.
"""

import re

import keras
import tensorflow as tf

from amptrain.models.layer_tree import children

HALF = ("float16", "bfloat16")
DUMMY_DIM = 8  # unknown batch and length dimensions of the traced dummy batch
LOSS_SCOPE = "loss"
# Ops that move or reinterpret data without arithmetic: one in float32 is no float32 compute.
BOOKKEEPING = frozenset(
    "Placeholder Const ReadVariableOp VarHandleOp Identity IdentityN Cast Reshape Transpose StridedSlice "
    "Slice GatherV2 ResourceGather Shape ShapeN Pack Unpack ConcatV2 ExpandDims Squeeze BroadcastTo Fill "
    "Tile ZerosLike OnesLike StopGradient Split SplitV Range NoOp".split()
)


def layer_tree(model):
    """{path: layer} of every layer below `model`, depth first; paths like "block_0/attention"."""
    layers = {}

    def visit(layer, prefix):
        for child in children(layer):
            if isinstance(child, keras.layers.InputLayer):
                continue
            layers[prefix + child.name] = child
            visit(child, prefix + child.name + "/")

    visit(model, "")
    return layers


def own_weights(layer):
    """The variables of `layer` itself, not of its sublayers."""
    nested = {id(v) for child in children(layer) for v in child.weights}
    return [v for v in layer.weights if id(v) not in nested]


def trace(model, inputs, loss_fn, targets):
    """Traces (does not run) a training-mode forward pass and the loss on its outputs."""
    inputs = _dummy(inputs if inputs is not None else _input_specs(model))
    targets = _dummy(targets) if loss_fn is not None else None

    @tf.function
    def forward(features, targets):
        outputs = model(features, training=True)
        if loss_fn is None:
            return outputs, ()
        with tf.name_scope(LOSS_SCOPE):
            return outputs, loss_fn(targets, outputs)

    concrete = forward.get_concrete_function(inputs, targets)
    outputs, losses = concrete.structured_outputs
    return concrete.graph, tf.nest.flatten(outputs), tf.nest.flatten(losses)


def _input_specs(model):
    try:
        symbolic = model.input
    except (AttributeError, ValueError):
        message = f"{model.name}: pass inputs= (tf.TensorSpecs): only a functional model knows its inputs"
        raise ValueError(message) from None
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), symbolic)


def _dummy(specs):
    return tf.nest.map_structure(lambda s: tf.TensorSpec([d or DUMMY_DIM for d in s.shape], s.dtype), specs)


def locator(model, layers):
    """op name -> path of the deepest layer whose name scope the op ran in (the model's
    name for its own ops, "loss" for the loss's)."""
    by_parent = {}
    for path, layer in layers.items():
        by_parent.setdefault(path.rpartition("/")[0], []).append((layer.name, path))

    def locate(op_name):
        scopes = op_name.split("/")[:-1]
        if scopes and _scope_of(LOSS_SCOPE, scopes[0]):
            return LOSS_SCOPE
        if not scopes or not _scope_of(model.name, scopes[0]):
            return model.name
        path = ""
        for scope in scopes[1:]:
            # A name first, then a name with the `_N` suffix of a second call or trace.
            match = [p for name, p in by_parent.get(path, ()) if name == scope]
            match = match or [p for name, p in by_parent.get(path, ()) if _scope_of(name, scope)]
            if not match:
                break
            path = match[0]
        return path or model.name

    return locate


def _scope_of(name, scope):
    return scope == name or re.fullmatch(re.escape(name) + r"_\d+", scope) is not None


def op_dtype(op):
    return op.outputs[0].dtype.name if op.outputs else None
