"""Check-numerics mode: stop at the first op whose output holds a NaN or an inf, and say
which op, in which Keras layer, what value and what dtype.

    run_config = check_numerics.enable(config)   # jit_compile off for the run, logged
    try:
        run_training(job, run_config, ...)
    except tf.errors.InvalidArgumentError as error:
        if check_numerics.detected(error):
            raise NumericsError(check_numerics.explain(error, model)) from error
        raise
    finally:
        check_numerics.disable()

`tf.debugging.enable_check_numerics` adds a check after every float op of every graph
traced from then on, and the failure message it raises carries the op's type, its graph
node name (the name scopes of the Keras layers it ran in), the dtype and the stack of
its creation. `explain` reads that message; TF offers these facts nowhere else. The
checks run beside the ops, not in line with them, so the op named is the first one
*detected*: nearly always the first that produced the value.
"""

import dataclasses
import logging
import re
import traceback

import tensorflow as tf

from amptrain import xla_modes
from amptrain.models.layer_tree import children

# The engine's logger ("amptrain"), named here: precision does not import the engine.
logger = logging.getLogger("amptrain")

DETECTED = re.compile(r'Detected Infinity or NaN in output (\d+) of (graph|eagerly-executing) op "([^"]+)"')
_DTYPE = re.compile(r"dtype: <dtype: '(\w+)'>")
_VALUES = re.compile(r"Tensor had (.+?) values")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_CHECK_OP = re.compile(r"/?CheckNumericsV2(_\d+)?$")
_GRAPH = re.compile(r'Graph name: "([^"]*)"')
_FILE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_STACK_FRAME = re.compile(r"\+ (\S+) \(L(\d+)\) (\S+)\n -> \|")
# A graph makes a name scope unique by adding `_N`; Keras enters each layer's scope
# twice (to build, then to call), so the call's ops always carry the suffix.
_UNIQUE_SUFFIX = re.compile(r"_\d+$")
_KINDS = {"NaN": "NaN", "+Inf": "+inf", "-Inf": "-inf"}
GRADIENT_SCOPE = "gradient_tape"


def enable(config, xla_asked=None):
    """Turns check-numerics on (this thread) and returns `config` with XLA off (the step's and
    the layers' kernels: `runtime.fused_kernels`). `xla_asked`:
    whether the user's config named XLA (default: `config`'s own `jit_compile`, true or "fusible"; a
    run passes its config as given, since the probe has already turned XLA off)."""
    tf.debugging.enable_check_numerics()
    line = "check-numerics is on: the first NaN or inf any op produces stops the run, naming the op and its layer"
    if xla_modes.uses_xla(config.runtime.jit_compile) if xla_asked is None else xla_asked:
        line += "; XLA is off for this run (runtime.jit_compile = false): XLA cannot compile the check-numerics ops"
    logger.info(line)
    p = config.precision
    if p.policy == "mixed_float16" and p.loss_scale in ("auto", "dynamic"):
        # The dynamic scale finds its level by overflowing now and then on purpose.
        logger.info(
            "under mixed_float16 the dynamic loss scale's first overflow will stop the run too; "
            "a fixed precision.loss_scale low enough not to overflow (e.g. 128) lets the run go on to other values"
        )
    runtime = dataclasses.replace(config.runtime, jit_compile=False, fused_kernels=False)
    return dataclasses.replace(config, runtime=runtime)


def disable():
    """Turns check-numerics off again, so a later run in this process is not slowed by it."""
    tf.debugging.disable_check_numerics()


def detected(error):
    """True if `error` is a check-numerics failure (not some other invalid argument)."""
    return isinstance(error, tf.errors.InvalidArgumentError) and DETECTED.search(str(error)) is not None


def explain(error, model=None):
    """A diagnosis of a check-numerics failure: the op (type and name), the Keras layer
    (resolved against `model` when given), the kind of value, the dtype, where the op was
    made, and what to try. The first line alone says what and where."""
    facts = _read(str(error))
    layer, layer_class = _layer(facts["scopes"], model)
    where = f"layer {layer} ({layer_class})" if layer_class else f"layer {layer}" if layer else "no Keras layer"
    if layer or facts["backward"]:
        where += ", backward pass (a gradient)" if facts["backward"] else ", forward pass"
    kinds = " and ".join(facts["kinds"]) or "NaN or inf"
    lines = [
        f"check-numerics: a {facts['dtype']} {kinds} came out of op {facts['op_type']} in {where}",
        f"  op: {facts['op_type']}, node {facts['node'] or '(name not given)'}, output {facts['slot']}"
        + (f", graph {facts['graph']}" if facts["graph"] else ", run eagerly"),
    ]
    # An eager op's message has no stack: the Python traceback says where it ran.
    raised_at = None if facts["frame"] else _raised_at(error)
    if facts["frame"]:
        lines.append("  created at {}:{} (in {})".format(*facts["frame"]))
    elif raised_at:
        lines.append("  run at {}:{} (in {})".format(*raised_at))
    lines.append("  what to try: " + _advice(facts, layer))
    return "\n".join(lines)


def _read(message):
    """The facts of a check-numerics message, each None or empty when absent."""
    detected_op = DETECTED.search(message)
    nodes = _NODE.findall(message)
    node = _CHECK_OP.sub("", nodes[-1]) if nodes else ""
    scopes = node.split("/") if node else []
    backward = bool(scopes) and scopes[0] == GRADIENT_SCOPE
    graph = _GRAPH.search(message)
    dtype = _DTYPE.search(message)
    values = _VALUES.search(message)
    return {
        "slot": detected_op.group(1) if detected_op else "?",
        "op_type": detected_op.group(3) if detected_op else "(unknown op)",
        "node": node,
        "scopes": scopes[1:] if backward else scopes,
        "backward": backward,
        "graph": graph.group(1) if graph else None,
        "dtype": dtype.group(1) if dtype else "float",
        "kinds": [_KINDS[k] for k in re.findall(r"NaN|[+-]Inf", values.group(1))] if values else [],
        "frame": _creation_frame(message),
    }


def _creation_frame(message):
    """(path, line, function) of the innermost frame of our code that made the op.

    The "defined at" list has full paths; the stack of the op's creation cuts paths to
    50 characters, so it is the fallback, and library files are skipped in both."""
    for frames in (_FILE_FRAME.findall(message), _STACK_FRAME.findall(message)):
        own = [f for f in frames if not f[0].startswith("...") and "-packages/" not in f[0]]
        if own:
            return own[-1]
    return None


def _raised_at(error):
    """(path, line, function) of the innermost frame of our code the error passed through."""
    frames = traceback.extract_tb(error.__traceback__) if isinstance(error, BaseException) else []
    own = [(f.filename, f.lineno, f.name) for f in frames if "-packages/" not in f.filename]
    return own[-1] if own else None


def _layer(scopes, model):
    """(layer path, class name) of the Keras layers among the leading name scopes."""
    if model is None:
        # Without the model, the `_N` every Keras call scope carries marks the layers;
        # the last scope is the op's own name.
        names = []
        for scope in scopes[:-1]:
            if not _UNIQUE_SUFFIX.search(scope):
                break
            names.append(_UNIQUE_SUFFIX.sub("", scope))
        return "/".join(names) or None, None
    if not scopes or model.name not in (scopes[0], _UNIQUE_SUFFIX.sub("", scopes[0])):
        return None, None
    names, layer = [], model
    for scope in scopes[1:]:
        child = _sublayer(layer, scope)
        if child is None:
            break
        names.append(child.name)
        layer = child
    # Paths without the model's name, like Keras's variable paths (block_0/attention/qkv).
    return ("/".join(names), type(layer).__name__) if names else (model.name, type(model).__name__)


def _sublayer(layer, scope):
    """The direct sublayer that `scope` is the call scope of: its name plus the graph's
    `_N` (so `dense_1` is `dense` called, `dense_1_1` is `dense_1`), else its bare name."""
    for name in (_UNIQUE_SUFFIX.sub("", scope), scope):
        for child in children(layer):
            if child.name == name:
                return child
    return None


def _advice(facts, layer):
    if facts["backward"] and facts["dtype"] == "float16":
        return (
            "a float16 gradient overflowed: with a dynamic loss scale that is the scale probing upward, "
            "normally skipped; set a fixed precision.loss_scale low enough (e.g. 128), or use mixed_bfloat16"
        )
    if not layer:
        return (
            "the value was made outside the model's layers (the loss, the training step or its bookkeeping): see where"
        )
    growing = "if the weights grew without bound, a lower train.learning_rate or train.clip_norm"
    if facts["dtype"] in ("float16", "bfloat16"):
        return f'pin layer {layer} to float32 (dtype="float32") if its values outgrow {facts["dtype"]}; {growing}'
    return f"{growing}; else look at what feeds the op (its inputs are in the TensorFlow message this came from)"
