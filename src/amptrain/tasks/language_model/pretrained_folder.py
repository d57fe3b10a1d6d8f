"""`amptrain predict FOLDER` on a pretrained language model's folder itself (GPT-2, Llama 3,
Qwen2, Gemma as `transformers` saves them): what the checkpoint does before any fine-tuning,
with the same `[generate]` options as a run's predict.

    task, model, weights = load_pretrained("tests/pretrained/tiny-llama3", ["generate.max_new_tokens=20"])
    task.predict_texts(["In the beginning"], model, predict)   # predict: the engine's pass (api.load_run)
"""

import os
import shutil
import tempfile
import weakref

from amptrain import config as config_lib

PRETRAINED_PREDICT_LENGTH = 1024  # positions a pretrained folder generates over at most (prompt and continuation)


def is_pretrained_folder(path):
    """A model folder as `transformers` saves it (config.json), not a run folder (config.toml),
    or a GGUF file (llama.cpp's), read as the folder it converts to."""
    if os.path.isfile(path) and path.endswith(".gguf"):
        return True
    return os.path.isfile(os.path.join(path, "config.json")) and not os.path.exists(os.path.join(path, "config.toml"))


def load_pretrained(folder, overrides=(), policy="float32"):
    """(task, model, weights file) of a pretrained language model's folder itself, for
    `api.load_run`: the language-model task on its checkpoint (no run folder, no training;
    `[generate]` from `overrides`), the model built under `policy`. A folder of another
    family is refused as `fit` refuses it."""
    from amptrain.config.pretrained import read_checkpoint
    from amptrain.tasks import create_task

    checkpoint = read_checkpoint(folder)
    length = min(checkpoint.max_positions, PRETRAINED_PREDICT_LENGTH)
    raw = {
        "task": "language_model",
        "data": {"train": folder, "max_length": length},
        "model": {"pretrained": folder, "dropout": 0.0},
        "precision": {"policy": policy},
    }
    config = config_lib.config_from_dict(raw, overrides, source=folder, check_files=False)
    scratch = tempfile.mkdtemp(prefix="amptrain-pretrained-")  # the task's run folder, gone with it
    task = create_task(config, scratch)
    weakref.finalize(task, shutil.rmtree, scratch, ignore_errors=True)
    task.prepare(())
    model, _, _ = task.create_model()
    return task, model, checkpoint.weights_path
