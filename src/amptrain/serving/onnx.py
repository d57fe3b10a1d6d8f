"""The token-ids graph as ONNX (tf2onnx), for onnxruntime: `amptrain export RUN --format onnx`.

    require_onnx()                         # UserError naming the extra when tf2onnx or onnxruntime is missing
    save_onnx(module, "export/1/model.onnx")
    session = onnx_session("export/1/model.onnx")
    session.run(None, {"token_ids": ids})  # [logits, probabilities]

Only the `serve_token_ids` signature converts: the text signature's tokenizer and string
ops (TensorFlow Text) have no ONNX form, so an ONNX caller tokenizes itself (the run's
`vocab.txt`, as `data/vocabulary.py` does). The translator's beam search, a `tf.while_loop`
over a cache of keys and values, is not offered in ONNX: it stays a SavedModel
(`UserError` says so).
"""

import importlib.util

from amptrain.errors import UserError

OPSET = 17
EXTRA = "pip install 'amptrain[onnx]'"


def require_onnx():
    """Raises a one-line UserError unless tf2onnx and onnxruntime are installed."""
    missing = [name for name in ("tf2onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"--format onnx needs {' and '.join(missing)} (not installed); {EXTRA}")


def save_onnx(module, path):
    """Converts the module's token-ids function to ONNX at `path` (its folder is made)."""
    import os

    import tf2onnx

    os.makedirs(os.path.dirname(path), exist_ok=True)
    specs = module.serve_ids.input_signature
    tf2onnx.convert.from_function(
        module.serve_ids,
        input_signature=specs,
        opset=OPSET,
        output_path=path,
        custom_op_handlers={"Erfc": (_erfc, [])},
    )


def _erfc(ctx, node, name, args):
    """TensorFlow's Erfc (Keras' exact GELU is 0.5·x·erfc(-x/√2)), which tf2onnx does not
    map, as 1 - Erf(x): ONNX has Erf. For large x, 1 - erf(x) is 0 where erfc(x) is a tiny
    positive number; GELU multiplies it by x, so the outputs differ by under 1e-7."""
    import numpy as np
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=dtype))
    erf = ctx.make_node("Erf", [node.input[0]], name=utils.make_name(f"{name}_erf"))
    outputs, shapes, dtypes = node.output, [ctx.get_shape(node.output[0])], [ctx.get_dtype(node.output[0])]
    ctx.remove_node(node.name)
    return ctx.make_node(
        "Sub", [one.output[0], erf.output[0]], outputs=outputs, name=name, shapes=shapes, dtypes=dtypes
    )


def onnx_session(path):
    """An onnxruntime session over the ONNX file at `path`, on the CPU."""
    import onnxruntime

    return onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
