"""The classic TensorFlow mixed-precision recipe, on Keras 3, trained through amptrain.

The recipe: a user's `build_transformer_model()`, a custom attention layer pinned to float32
(`super().__init__(dtype="float32")`), `mixed_float16`, `steps_per_execution = 50`. Here the
same model goes to `amptrain.Trainer`, which builds it under the policy (and a strategy's
scope), scales the loss, records the scale and the skipped steps, keeps the best
checkpoint, resumes exactly and exports.

    python examples/classic_recipe/classic_recipe.py                 # amptrain.Trainer (make classic-recipe)
    python examples/classic_recipe/classic_recipe.py --keras-fit     # the recipe under Keras model.fit
    python examples/classic_recipe/classic_recipe.py --set train.steps=20 --run-dir /tmp/x

Data: the bundled spam mails (data/classify-spam), tokenized by Keras' TextVectorization
adapted on the training split (id 0 is padding).
"""

import argparse
import csv
import json
import os
import sys

import keras
import numpy as np
from keras import ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPAM = os.path.join(ROOT, "data", "classify-spam")
VOCABULARY_SIZE, MAX_LENGTH = 8000, 128
LABELS = ["ham", "spam"]


# === The user's model ===


class CustomAttention(keras.layers.Layer):
    """Multi-head self-attention pinned to float32, as the recipe does: its softmax and the
    scores' large values stay out of float16."""

    def __init__(self, num_heads, key_dim, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.attention = keras.layers.MultiHeadAttention(num_heads, key_dim, dtype="float32", name="mha")

    def call(self, x, padding_mask):
        x = ops.cast(x, "float32")
        mask = padding_mask[:, None, :]  # (batch, 1, length): every query sees the real keys
        return self.attention(x, x, attention_mask=mask)


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to the token embeddings."""

    def __init__(self, max_length, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.positions = keras.layers.Embedding(max_length, hidden_dim, dtype=self.dtype_policy, name="positions")

    def call(self, x):
        return x + self.positions(ops.arange(ops.shape(x)[1]))[None]  # (batch, length, hidden)


def build_transformer_model(policy=None, vocabulary_size=VOCABULARY_SIZE, max_length=MAX_LENGTH, hidden_dim=64):
    """The recipe's Transformer classifier. Layers without a dtype follow the global policy
    (amptrain sets it to `policy` while it calls this); CustomAttention and the logits are float32."""
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    padding_mask = ops.not_equal(token_ids, 0)
    x = keras.layers.Embedding(vocabulary_size, hidden_dim, name="token_embedding")(token_ids)
    x = PositionEmbedding(max_length, hidden_dim, name="position_embedding")(x)
    attended = CustomAttention(num_heads=4, key_dim=hidden_dim // 4, name="custom_attention")(x, padding_mask)
    x = keras.layers.LayerNormalization(name="norm_1")(keras.layers.Add()([x, attended]))
    hidden = keras.layers.Dense(hidden_dim * 2, activation="relu", name="ffn_in")(x)
    x = keras.layers.LayerNormalization(name="norm_2")(
        keras.layers.Add()([x, keras.layers.Dense(hidden_dim, name="ffn_out")(hidden)])
    )
    pooled = keras.layers.GlobalAveragePooling1D(name="pooling")(x, mask=padding_mask)
    logits = keras.layers.Dense(len(LABELS), dtype="float32", name="logits")(pooled)
    return keras.Model({"token_ids": token_ids}, logits, name="classic_transformer")


# === The user's data ===


def load_spam(folder=SPAM, limit=None):
    """{split: (features, labels)}: the mails as token ids (TextVectorization on train)."""
    texts, labels = {}, {}
    for split in ("train", "dev", "test"):
        with open(os.path.join(folder, f"{split}.csv"), encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))[:limit]
        texts[split] = [r["text"] for r in rows]
        labels[split] = np.array([LABELS.index(r["label"]) for r in rows], np.int32)
    vectorize = keras.layers.TextVectorization(VOCABULARY_SIZE, output_sequence_length=MAX_LENGTH)
    vectorize.adapt(texts["train"])
    return {
        split: ({"token_ids": np.asarray(vectorize(texts[split])).astype(np.int32)}, labels[split]) for split in texts
    }


# === Training ===

CONFIG = {
    "precision.policy": "mixed_float16",
    "runtime.steps_per_execution": 50,
    "train.epochs": 3,
    "train.batch_size": 32,
    "train.log_every": 50,
    "train.checkpoint_every": 100,
}


def recipe_optimizer():
    """The recipe's optimizer: Adam at a constant 1e-3, no clipping."""
    return keras.optimizers.Adam(1e-3)


def recipe_callbacks():
    """The recipe's callbacks, the same under model.fit and amptrain.Trainer: stop when dev
    accuracy has not risen for 2 epochs."""
    return [keras.callbacks.EarlyStopping(monitor="val_accuracy", mode="max", patience=2)]


def trainer(data, run_dir, settings=(), overwrite=False):
    import amptrain

    config = {**CONFIG, **dict(settings)}
    return amptrain.Trainer(
        model=build_transformer_model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        train=data["train"],
        validation=data["dev"],
        test=data["test"],
        # A function: amptrain makes it under the strategy's scope (`mirrored` too), and
        # scales the loss itself (no LossScaleOptimizer).
        optimizer=recipe_optimizer,
        callbacks=recipe_callbacks(),
        config=config,
        run_dir=run_dir,
        overwrite=overwrite,
    )


def keras_recipe(seed=0):
    """The recipe's model compiled for Keras `model.fit` (one device), as `keras_fit` trains it:
    the global policy set to mixed_float16, Adam at 1e-3 in a LossScaleOptimizer, 50 steps
    per execution. Set the policy back to float32 when done.

        model = keras_recipe()
        model.fit(*load_spam()["train"], batch_size=CONFIG["train.batch_size"], epochs=1)
    """
    keras.utils.set_random_seed(seed)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = build_transformer_model()
    optimizer = keras.optimizers.LossScaleOptimizer(recipe_optimizer())
    model.compile(
        optimizer,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=50,
    )
    return model


def keras_fit(data, run_dir, epochs=3, seed=0):
    """The recipe itself under Keras `model.fit` (one device): test accuracy of the best dev epoch."""
    model = keras_recipe(seed)
    os.makedirs(run_dir, exist_ok=True)
    best = os.path.join(run_dir, "best.weights.h5")
    checkpoint = keras.callbacks.ModelCheckpoint(
        best, monitor="val_accuracy", save_best_only=True, save_weights_only=True
    )
    batch_size = CONFIG["train.batch_size"]
    callbacks = recipe_callbacks() + [checkpoint]  # amptrain keeps the best checkpoint itself
    model.fit(*data["train"], batch_size=batch_size, epochs=epochs, validation_data=data["dev"], callbacks=callbacks)
    model.load_weights(best)
    loss, accuracy = model.evaluate(*data["test"], batch_size=batch_size, verbose=0)
    keras.mixed_precision.set_global_policy("float32")
    return {"loss": loss, "accuracy": accuracy}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=os.path.join(ROOT, "runs", "classic-recipe"))
    parser.add_argument("--set", action="append", default=[], help="a config key, e.g. train.steps=20")
    parser.add_argument("--limit", type=int, help="the first N mails of each split (a quick try)")
    parser.add_argument("--keras-fit", action="store_true", help="train with Keras model.fit instead")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    import amptrain
    from amptrain.config import parse_override

    settings = [parse_override(s) for s in args.set]
    amptrain.configure_devices({**CONFIG, **dict(settings)})  # runtime.cpu_replicas: before TensorFlow runs
    data = load_spam(limit=args.limit)
    if args.keras_fit:
        print(json.dumps({"keras_fit_test": keras_fit(data, args.run_dir)}))
        return 0
    run = trainer(data, args.run_dir, settings, args.overwrite)
    history = run.fit()  # as model.fit's: history.history["val_accuracy"], and the test metrics
    export = run.export(overwrite=True)  # None on a cluster's other workers: the chief exports
    print(json.dumps({"test": history.test, "history": history.history, "export": export and export["path"]}))
    print(f"run folder: {args.run_dir}   (tensorboard --logdir {args.run_dir}/tensorboard)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
