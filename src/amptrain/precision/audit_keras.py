"""The precision audit of a user's own Keras model (`amptrain.audit(model_or_builder, policy=...)`):
the same report as a config's (`precision/audit.py`).

    report = amptrain.audit(build_transformer_model, policy="mixed_float16")   # builder: policy -> keras.Model
    report = amptrain.audit(model, policy="mixed_float16", inputs={"token_ids": tf.TensorSpec((None, 128), tf.int32)})

A builder is called with the policy the global Keras one, as `amptrain.Trainer` builds it
(`tasks/keras_model/task.py`): a layer that then computes in float32 had float32 given to its
constructor, so it is a float32 island its code declared (the classic recipe's
`super().__init__(dtype="float32")`), and its row says so. A built model counts as built under
the policy when the model itself has the policy (Keras gives it the global one); otherwise
a float32 layer without a `float32_reason` is one that ignored the policy.
"""

import keras

from amptrain.errors import UserError
from amptrain.precision.audit import audit_model


def audit_keras(model_or_builder, policy=None, loss_scale="auto", inputs=None, loss_fn=None, targets=None):
    """`audit_model`'s report of a keras.Model, or of `builder(policy)` built under `policy`.
    `policy` defaults to a built model's own; `inputs`: tf.TensorSpecs (needed unless the
    model is functional)."""
    if isinstance(model_or_builder, keras.Model):
        model = model_or_builder
        policy = policy or model.dtype_policy.name
        built_under = model.dtype_policy.name == policy
    elif callable(model_or_builder):
        if policy is None:
            raise UserError("audit: policy= is required with a builder, e.g. policy='mixed_float16'")
        model, built_under = _build(model_or_builder, policy), True
    else:
        raise UserError(
            f"audit: expected a config path, a keras.Model or a builder (policy -> keras.Model), "
            f"received {type(model_or_builder).__name__}"
        )
    keras.DTypePolicy(policy)  # an unknown policy name is an error here, before the trace
    return audit_model(model, policy, loss_scale, inputs, loss_fn, targets, built_under_policy=built_under)


def _build(builder, policy):
    from amptrain.models.builders import build_under_policy

    return build_under_policy(builder, policy, what="audit")
