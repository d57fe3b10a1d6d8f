"""An export read back: `amptrain predict EXPORT_DIR` runs its SavedModel, not amptrain's model.

    path = find_export("runs/classify-spam/export")   # its newest version folder, or None
    export_predictor(path)(["see you at lunch"])      # the same records as `amptrain predict RUN`

Loading is TensorFlow's `tf.saved_model.load` (with TensorFlow Text's ops registered):
no model is built and nothing is compiled beyond the saved graph; each call runs the
`serving_default` signature once over all the texts.
"""

import json
import os

from amptrain.errors import UserError

SAVED_MODEL_FILE = "saved_model.pb"
METADATA_FILE = os.path.join("assets.extra", "amptrain-export.json")  # TF Serving ignores assets.extra


def find_export(path):
    """`path` if it holds a SavedModel, else its newest numbered version folder that does,
    else None (`path` is then no export: a run folder, say). An ONNX version folder is
    refused: it takes token ids, not text."""
    if os.path.isfile(os.path.join(path, SAVED_MODEL_FILE)):
        return path
    if os.path.isfile(os.path.join(path, "model.onnx")):
        raise UserError(
            f"{path}: an ONNX export takes token ids, not text; predict with a SavedModel export "
            "(`amptrain export RUN` without --format onnx)"
        )
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.toml")):
        return None
    versions = sorted((name for name in os.listdir(path) if name.isdigit()), key=int, reverse=True)
    return next(
        (os.path.join(path, v) for v in versions if os.path.isfile(os.path.join(path, v, SAVED_MODEL_FILE))), None
    )


def read_metadata(path):
    """The export's `assets.extra/amptrain-export.json` (task, labels, signatures)."""
    try:
        with open(os.path.join(path, METADATA_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        raise UserError(f"{path}: no readable {METADATA_FILE}; expected a folder made by `amptrain export`") from None


def export_predictor(path, skip_blank=False, trust=False, overrides=(), precision=None):
    """The SavedModel loaded once: a callable texts -> records, as `api.predict` makes them from
    a run (classification: probabilities rounded to 6 decimals), with the export's Task class
    as its `task_class` (`predict --input` calls it a chunk of lines at a time). `overrides`:
    settings the export takes (a language model's `generate.*`), refused in one line where
    it takes none."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer's ops before loading)

    from amptrain.config.files import parse_override

    if precision is not None:
        raise UserError(f"{path}: --precision is for a pretrained folder; an export answers in the one it was made in")
    overrides = [parse_override(o) if isinstance(o, str) else tuple(o) for o in overrides]
    metadata = read_metadata(path)
    task_class = exported_task(metadata, carried_by=path, trust=trust)
    module_class = serving_class(task_class, metadata["task"], metadata.get("task_path", ""))
    serve = module_class.answer(load_saved_model(path), metadata, overrides)
    records = module_class.records
    keeps_blank_lines = metadata.get("keeps_blank_lines", task_class.keeps_blank_lines)  # older exports: the class's

    def predict(texts):
        texts = list(texts)
        if skip_blank and not keeps_blank_lines:
            texts = [t for t in texts if t.strip()]
        if not texts:
            return []
        outputs = {k: v.numpy() for k, v in serve(tf.constant(texts, tf.string)).items()}
        return records(texts, outputs, metadata)

    predict.task_class = task_class
    return predict


def load_saved_model(path):
    """`tf.saved_model.load(path)`, or one line naming the folder when it does not load (a
    truncated `saved_model.pb`, an empty `variables.index`, ...)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer's ops before loading)

    try:
        return tf.saved_model.load(path)
    except Exception as error:
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        raise UserError(
            f"{path}: cannot load this SavedModel ({type(error).__name__}: {reason}); "
            "expected a version folder written whole by `amptrain export`"
        ) from None


def exported_task(metadata, carried_by=None, trust=False):
    """The Task subclass an export's metadata names; `carried_by`, `trust`: the folder that
    named it, as `registry.task_class` takes them."""
    from amptrain import registry

    task_path = metadata.get("task_path", "")
    return registry.task_class(metadata["task"], [task_path] if task_path else [], carried_by=carried_by, trust=trust)


def serving_class(task_class, task, task_path=""):
    """The serving module class of `task_class` (named `task` in the config): the task names
    it (`Task.serving_module`). A task without one cannot be exported."""
    from amptrain import registry

    module_class = task_class.serving_module
    if module_class is None:
        raise UserError(
            f"task {task!r} has no serving module (its Task.serving_module is None), so it cannot be exported"
        )
    if isinstance(module_class, str):  # a user's task may still name it "module:Class"
        return registry.import_object(module_class, [task_path] if task_path else [], what="serving module")
    return module_class
