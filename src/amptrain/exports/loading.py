"""A run's task and model as an export needs them: the config's vocabulary and labels,
the model rebuilt in the export's precision and given the chosen checkpoint's weights.

    task, model, checkpoint = load_for_export("runs/classify-spam", "best", "float32")

The checkpoints hold float32 master weights whatever the training policy, so one
checkpoint gives a float32 export or a half-precision one (`PRECISIONS`): the variables
stay float32 in both; half precision changes only what the layers compute in.
"""

import os

from amptrain import config as config_lib
from amptrain.errors import UserError

# --precision -> the Keras policy the model is rebuilt under (float32 islands as in training).
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
CHECKPOINTS = ("best", "latest")


def pretrained_policy(precision):
    """The policy of `predict --precision` on a pretrained folder (float32 unless named)."""
    precision = precision or "float32"
    if precision not in PRECISIONS:
        raise UserError(f"--precision: expected one of {', '.join(PRECISIONS)}, received {precision!r:.40}")
    return PRECISIONS[precision]


def load_config(run_dir, overrides=(), splits=(), trust=False):
    """The run's saved config with `overrides` (`--set decode.beam_size=…`) applied. Its data
    files need not exist (a run folder moved to another machine predicts and exports from
    its own files), except those of `splits`, which the caller reads. A user's task module
    it names is imported only if this user ran `fit` with it, or with `trust`
    (`registry.task_class`)."""
    saved_path = os.path.join(run_dir, "config.toml")
    if not os.path.exists(saved_path):
        raise UserError(f"{run_dir}: no config.toml; expected a run folder made by `amptrain fit`")
    config = config_lib.load_config(
        saved_path, overrides, base_dir=run_dir, check_files=False, carried_by=run_dir, trust=trust
    )
    for split in splits:
        path = getattr(config.data, split, None)
        if path and not os.path.isfile(path):
            raise UserError(f"data.{split}: expected an existing file, received {path!r}; pass --data PATH")
    return config


def checkpoint_path(run_dir, which):
    """The prefix of the run's best (else latest) or latest intact checkpoint."""
    from amptrain.engine.checkpoints import best_or_latest
    from amptrain.engine.run_folder.checkpoint_files import newest_intact

    directory = os.path.join(run_dir, "checkpoints")
    path = best_or_latest(directory) if which == "best" else newest_intact(directory, purpose="the export")
    if path is None:
        raise UserError(f"{run_dir}/checkpoints: no checkpoint to export; train first with `amptrain fit`")
    return path


def load_for_export(run_dir, which="best", precision="float32", overrides=(), make_task=None):
    """(task, model, checkpoint path): the run's task prepared from its folder alone (no
    data split read; `make_task(config, run_dir)` builds it, by default from the config)
    and its model built under `precision`'s policy with the weights of the `which` checkpoint."""
    from amptrain.engine.checkpoints import restore_model
    from amptrain.engine.run_folder import learned_files
    from amptrain.tasks import create_task

    config = load_config(run_dir, overrides)
    path = checkpoint_path(run_dir, which)  # before the slow work
    task = (make_task or create_task)(config, run_dir)
    learned_files.check(run_dir)
    task.prepare(())
    model = task.build_model(PRECISIONS[precision])
    restore_model(model, path, run_dir, learned_files.names(task), check_all=True)
    return task, model, path
