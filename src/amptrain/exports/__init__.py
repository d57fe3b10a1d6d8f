"""`amptrain export`: a trained run as a SavedModel that takes raw text (TF Serving's
layout), or as an ONNX model of its token-ids graph.

    from amptrain.exports import export_run
    export_run("runs/classify-spam")                    # runs/classify-spam/export/1/saved_model.pb
    export_run("runs/ner-wnut17", fmt="onnx")        # runs/ner-wnut17/export-onnx/1/model.onnx

`loading` rebuilds the run's model and restores a checkpoint; the task's serving graph
(its `Task.serving_module`, a `serving.modules.ServingModule` in the task's own package)
tokenizes in the graph; `serving.onnx` converts the token-ids graph; `serving.served` reads
an export back for `amptrain predict EXPORT_DIR`. The SavedModel needs TensorFlow and TensorFlow Text to
load, nothing of amptrain.
"""

import json
import os
import shutil

from amptrain.errors import UserError
from amptrain.exports.loading import CHECKPOINTS, PRECISIONS
from amptrain.gguf_files.writer import QUANTIZE
from amptrain.serving.served import METADATA_FILE

FOLDER_FORMATS = ("transformers", "gguf")  # written by the task itself (`Task.write_export`), into one folder
FORMATS = ("saved_model", "onnx", *FOLDER_FORMATS)
ONNX_FILE = "model.onnx"


def export_run(run_dir, out=None, fmt="saved_model", checkpoint="best", version=1, overwrite=False, *,
               precision="float32", overrides=(), make_task=None, trust=False, quantize=None):  # fmt: skip
    """Writes the export of `run_dir` to `out`/`version` (default `run_dir`/export/1, or
    `run_dir`/export-onnx/1 for ONNX; `out`, default `run_dir`/export-FORMAT, for a task's own
    folder format) and returns {"path", "format", "task", "checkpoint", "precision", "bytes"}.
    `make_task`: as `load_for_export`'s (`amptrain.Trainer` passes the user's pieces); `trust`:
    import the user task module the run's config names even if this user never ran `fit` with
    it; `quantize`: a GGUF file's (f32, f16, bf16, q8_0, q4_0)."""
    from amptrain.exports.loading import load_config

    _check_choices(fmt, checkpoint, precision, version, quantize)
    config = load_config(run_dir, overrides, trust=trust)  # a folder that is no run: one line, nothing written
    if fmt in FOLDER_FORMATS:
        choices = (checkpoint, overwrite, precision, quantize)
        return _export_folder(run_dir, config, out, fmt, choices, overrides, make_task)
    if fmt == "onnx":
        from amptrain.serving.onnx import require_onnx

        require_onnx()  # before TensorFlow loads: a missing extra is one line at once
        from amptrain.config.files import task_class_of
        from amptrain.serving.served import serving_class

        module_class = serving_class(task_class_of(config), config.task, config.task_path)
        if not module_class.converts_to_onnx:
            raise UserError(f"{run_dir}: {module_class.onnx_refusal}; leave out --format onnx")
    target = os.path.join(out or default_out(run_dir, fmt), str(version))
    _claim(target, overwrite)
    from amptrain.exports.loading import load_for_export

    task, model, path = load_for_export(run_dir, checkpoint, precision, overrides, make_task)
    module = serving_module(task, model)
    staging = target + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        if fmt == "saved_model":
            save_saved_model(module, staging)
        else:
            from amptrain.serving.onnx import save_onnx

            save_onnx(module, os.path.join(staging, ONNX_FILE))
        metadata = _metadata(task, run_dir, path, fmt, precision, module)
        _write_metadata(staging, metadata)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)  # a half-written export never sits at the version's path
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {
        "path": target,
        **{k: metadata[k] for k in ("format", "task", "checkpoint", "precision")},
        "bytes": size(target),
    }


def _export_folder(run_dir, config, out, fmt, choices, overrides, make_task):
    """A format the task writes itself into `out` (default RUN/export-FORMAT), no version
    folder: the model rebuilt in float32 and written in `precision` or as `quantize` says
    (`Task.write_export`). `choices`: (checkpoint, overwrite, precision, quantize)."""
    from amptrain.config.files import task_class_of
    from amptrain.exports.loading import load_for_export

    checkpoint, overwrite, precision, quantize = choices
    if fmt not in task_class_of(config).export_formats:
        raise UserError(
            f"{run_dir}: --format {fmt} is for a language model fine-tuned from a pretrained folder; "
            f"this run's task ({config.task}) exports as saved_model or onnx"
        )
    if fmt == "gguf":  # a family or RoPE the file cannot hold: refused before the model is rebuilt
        from amptrain.config.pretrained import read_checkpoint
        from amptrain.gguf_files.writer import check_folder

        check_folder(read_checkpoint(config.model.pretrained).path)
    target = out or os.path.join(run_dir, f"export-{fmt}")
    _claim(target, overwrite)
    task, model, path = load_for_export(run_dir, checkpoint, "float32", overrides, make_task)
    staging = target.rstrip("/") + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        figures = task.write_export(fmt, model, staging, precision, quantize)
        metadata = {"format": fmt, "task": task.config.task, "run_dir": os.path.abspath(run_dir)}
        metadata.update(checkpoint=os.path.basename(path), precision=precision, **figures)
        _write_metadata(staging, metadata)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    kept = ("format", "task", "checkpoint", "precision")
    return {"path": target, **{k: metadata[k] for k in kept}, "bytes": size(target)}


def default_out(run_dir, fmt):
    """RUN/export for a SavedModel; RUN/export-onnx for ONNX, so that the folder a TF Serving
    model server watches (it loads the highest version) never gets a version it cannot load."""
    return os.path.join(run_dir, "export" if fmt == "saved_model" else "export-onnx")


def _check_choices(fmt, checkpoint, precision, version, quantize=None):
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown export format; expected one of {', '.join(FORMATS)}")
    if checkpoint not in CHECKPOINTS:
        raise UserError(f"--checkpoint {checkpoint}: expected one of {', '.join(CHECKPOINTS)}")
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    if not isinstance(version, int) or version < 0:
        raise UserError(f"--version {version}: expected a whole number >= 0 (TF Serving's version folder)")
    if quantize and fmt != "gguf":
        raise UserError(f"--quantize {quantize}: for --format gguf; {fmt} takes --precision")
    if fmt == "gguf" and precision != "float32":
        raise UserError(f"--precision {precision}: for --format transformers or a SavedModel; gguf takes --quantize")
    if fmt == "gguf" and quantize not in (None, *QUANTIZE):
        raise UserError(f"--quantize {quantize}: expected one of {', '.join(QUANTIZE)}")


def _claim(target, overwrite):
    """Refuses an existing version folder unless `overwrite` (it is replaced only once the
    new export is complete)."""
    if os.path.exists(target) and not overwrite:
        raise UserError(f"{target}: this export version exists; pass --overwrite to replace it, or --version N")
    from amptrain.serving.served import METADATA_FILE

    replaceable = os.path.isdir(target) and (
        not os.listdir(target) or os.path.isfile(os.path.join(target, METADATA_FILE))
    )
    if os.path.exists(target) and not replaceable:
        # --overwrite replaces an export amptrain wrote (or an empty folder), never the user's files.
        raise UserError(
            f"{target}: exists and is not an amptrain export (no {METADATA_FILE}); it is left as it is: "
            "pass --out or --version for a new folder"
        )
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    except OSError as error:
        raise UserError(f"{os.path.dirname(target)}: cannot create the export folder ({error.strerror})") from None


def serving_module(task, model):
    """The task's serving module (`Task.serving_module`) over `model`."""
    from amptrain.serving.served import serving_class

    return serving_class(type(task), task.config.task, task.config.task_path)(task, model)


def save_saved_model(module, path):
    """The SavedModel at `path` with the module's two signatures."""
    import tensorflow as tf

    tf.saved_model.save(module, path, signatures=module.signatures())


def _metadata(task, run_dir, checkpoint, fmt, precision, module):
    return {
        "format": fmt,
        "task": task.config.task,
        "task_path": task.config.task_path,  # where a user's task module lives ("" for amptrain's)
        "run_dir": os.path.abspath(run_dir),
        "checkpoint": os.path.basename(checkpoint),
        "precision": precision,
        "labels": list(task.labels) if task.labels is not None else None,
        "keeps_blank_lines": task.keeps_blank_lines,  # predict --input: a line out for each line in
        **module.describe(),
    }


def _write_metadata(directory, metadata):
    path = os.path.join(directory, METADATA_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=2, ensure_ascii=False)


def size(path):
    """Bytes of every file under `path`."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
