"""amptrain: train Transformer models fast and without numeric surprises in mixed precision.

import amptrain
amptrain.fit("configs/classify-spam.toml", overrides={"train.steps": 200})
amptrain.Trainer(model=build, loss=..., metrics=["accuracy"], train=train_ds).fit()   # your own model
"""

__version__ = "0.1.0"


def __getattr__(name):
    # `amptrain.Trainer` imports TensorFlow only when asked for (`import amptrain` stays quick).
    if name in ("Trainer", "configure_devices"):
        from amptrain import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'amptrain' has no attribute {name!r}")


def fit(config_path, overrides=(), run_dir=None, overwrite=False):
    """Trains (or resumes) a run from a TOML config; see `amptrain.api.fit`."""
    from amptrain import api

    return api.fit(config_path, overrides, run_dir=run_dir, overwrite=overwrite)


def evaluate(run_dir, split="test", data=None):
    from amptrain import api

    return api.evaluate(run_dir, split=split, data=data)


def predict(run_dir, texts):
    from amptrain import api

    return api.predict(run_dir, texts)


def audit(config_path, overrides=(), policy=None):
    """The precision audit of a config's model (a dict: rows, risks, notes); see `amptrain.api.audit`."""
    from amptrain import api

    return api.audit(config_path, overrides, policy=policy)


def export(run_dir, out=None, fmt="saved_model", **options):
    """A run as a SavedModel that takes raw text (or ONNX); see `amptrain.api.export`."""
    from amptrain import api

    return api.export(run_dir, out, fmt, **options)
