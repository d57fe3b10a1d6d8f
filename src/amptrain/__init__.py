"""amptrain: train Transformer models fast and without numeric surprises in mixed precision.

import amptrain
amptrain.fit("configs/classify-spam.toml", overrides={"train.steps": 200})
amptrain.Trainer(model=build, loss=..., metrics=["accuracy"], train=train_ds).fit()   # your own model
amptrain.audit(build, policy="mixed_float16")   # your model's per-layer dtypes, islands and float16 risks
"""

__version__ = "0.1.0"


def __getattr__(name):
    # `amptrain.Trainer` imports TensorFlow only when asked for (`import amptrain` stays quick).
    if name in ("Trainer", "configure_devices"):
        from amptrain import trainer

        return getattr(trainer, name)
    if name == "remat":  # a layer of yours recomputed in the backward pass (models/remat.py)
        from amptrain.models.remat import remat

        return remat
    raise AttributeError(f"module 'amptrain' has no attribute {name!r}")


def fit(config_path, overrides=(), run_dir=None, overwrite=False):
    """Trains (or resumes) a run from a TOML config; see `amptrain.api.fit`."""
    from amptrain import api

    return api.fit(config_path, overrides, run_dir=run_dir, overwrite=overwrite)


def evaluate(run_dir, split="test", data=None, trust_run_code=False):
    from amptrain import api

    return api.evaluate(run_dir, split=split, data=data, trust_run_code=trust_run_code)


def predict(run_dir, texts, overrides=(), trust_run_code=False, precision=None):
    """One record a text (`amptrain.api.predict`); `overrides`: how to continue or decode,
    e.g. ["generate.temperature=0.8", "generate.seed=1"]. `run_dir` may be a pretrained
    language model's folder, run under `precision` (float32 unless named)."""
    from amptrain import api

    return api.predict(run_dir, texts, trust_run_code=trust_run_code, overrides=overrides, precision=precision)


def audit(config_or_model, overrides=(), policy=None, loss_scale="auto", inputs=None):
    """The precision audit (a dict: rows, risks, notes) of a config's model (a path; see
    `amptrain.api.audit`), or of your own: a keras.Model or a builder (policy -> keras.Model,
    built under `policy`), with `loss_scale` and `inputs` (tf.TensorSpecs, unless functional);
    see `amptrain.precision.audit_keras`. amptrain.audit(build, policy="mixed_float16")"""
    import os

    if isinstance(config_or_model, (str, os.PathLike)):
        from amptrain import api

        return api.audit(config_or_model, overrides, policy=policy)
    from amptrain.precision.audit_keras import audit_keras

    if overrides:
        from amptrain.errors import UserError

        raise UserError("audit: overrides are a config's; a model takes policy=, loss_scale=, inputs=")
    return audit_keras(config_or_model, policy, loss_scale, inputs)


def export(run_dir, out=None, fmt="saved_model", **options):
    """A run as a SavedModel that takes raw text (or ONNX); see `amptrain.api.export`."""
    from amptrain import api

    return api.export(run_dir, out, fmt, **options)
