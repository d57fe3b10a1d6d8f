"""Tracing a model for the precision audit (`precision/audit.py`): its layers by path,
one training-mode trace of the model and the loss on its outputs, and the layer each
op of that graph ran in.

    layers = layer_tree(model)                       # {"block_0/attention": layer, ...}
    graph, outputs, losses = trace(model, inputs, loss_fn, targets, layers)
    locate = locator(model, layers)
    locate(op.name)                                  # "block_0/attention", the model's name or "loss"

An op is mapped to the layer object whose call it ran in, so what is found is what runs.
Not by the layer's name: TensorFlow makes the name scopes of a graph unique, so a layer
named `dense` may trace under `dense_1`, the scope of its neighbour's name. While the trace
runs, each layer's `call` runs inside a scope of its own, `audit.N.` (N: its place in
`layers`), and the deepest such scope in an op's name is its layer.
"""

import contextlib
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


def trace(model, inputs, loss_fn, targets, layers=None):
    """Traces (does not run) a training-mode forward pass and the loss on its outputs, each
    layer of `layers` (`layer_tree`) marked with its own scope."""
    inputs = _dummy(inputs if inputs is not None else _input_specs(model))
    targets = _dummy(targets) if loss_fn is not None else None

    @tf.function
    def forward(features, targets):
        outputs = model(features, training=True)
        if loss_fn is None:
            return outputs, ()
        with tf.name_scope(LOSS_SCOPE):
            return outputs, loss_fn(targets, outputs)

    with _marked(layers or {}):
        concrete = forward.get_concrete_function(inputs, targets)
    outputs, losses = concrete.structured_outputs
    return concrete.graph, tf.nest.flatten(outputs), tf.nest.flatten(losses)


MARK = re.compile(r"audit\.(\d+)\.(?:_\d+)?")  # a second call's scope gets a `_N` suffix


@contextlib.contextmanager
def _marked(layers):
    """Each layer's `call` run inside the name scope `audit.N.` while the trace is made (an
    attribute of the layer object, removed after)."""
    marked = []
    try:
        for index, layer in enumerate(_unique(layers)):
            call = layer.call

            def scoped(*args, _call=call, _scope=f"audit.{index}.", **kwargs):
                with tf.name_scope(_scope):
                    return _call(*args, **kwargs)

            layer.__dict__["call"] = scoped  # past Keras's attribute tracking; the class's call stays
            marked.append(layer)
        yield
    finally:
        for layer in marked:
            layer.__dict__.pop("call", None)


def _unique(layers):
    """The layer objects of `layers`, each once (a shared layer has several paths), in order."""
    seen = {}
    for layer in layers.values():
        seen.setdefault(id(layer), layer)
    return list(seen.values())


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
    """op name -> path of the layer whose call the op ran in, the deepest (the model's name
    for its own ops, "loss" for the loss's), from the `audit.N.` scopes `trace` marked."""
    first_path = {}
    for path, layer in layers.items():
        first_path.setdefault(id(layer), path)
    paths = [first_path[id(layer)] for layer in _unique(layers)]

    def locate(op_name):
        scopes = op_name.split("/")[:-1]
        if scopes and _scope_of(LOSS_SCOPE, scopes[0]):
            return LOSS_SCOPE
        marks = [int(m.group(1)) for scope in scopes if (m := MARK.fullmatch(scope))]
        return paths[marks[-1]] if marks else model.name

    return locate


def _scope_of(name, scope):
    return scope == name or re.fullmatch(re.escape(name) + r"_\d+", scope) is not None


def op_dtype(op):
    return op.outputs[0].dtype.name if op.outputs else None
