"""A user's model builder called as the classic mixed-precision recipe expects.

    model = build_under_policy(build_transformer_model, "mixed_float16", what="model")

The builder gets the policy name, and the policy is Keras' global one while it runs, so
layers built without a `dtype` follow it (a layer that asks for float32 keeps it: an island).
"""

import keras

from amptrain.errors import UserError


def build_under_policy(builder, policy, what="model"):
    """`builder(policy)` under `policy` as the global policy (put back after); refuses, in one
    line naming `what`, a builder that returns no keras.Model."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = builder(policy)
    finally:
        keras.config.set_dtype_policy(previous)
    if not isinstance(model, keras.Model):
        raise UserError(f"{what}: the builder returned {type(model).__name__}, not a keras.Model")
    return model
