"""Low-rank adapters on a pretrained language model (`train.lora_rank`, `lora_alpha`,
`lora_targets`): every pretrained weight frozen, and each targeted projection of each
decoder layer given Keras' LoRA (`enable_lora`: A and B trained in float32, computed as
x K + (alpha / rank) (x A) B: `projections.py`), so the optimizer holds slots for the adapters
alone.

    apply_lora(model, config.train)      # after the weights are loaded
    adapters(model)                      # the A and B variables, what a checkpoint holds
    merge_lora(model)                    # each kernel becomes kernel + (alpha / rank) A B (the export)

A target is a projection's name (query, key, value, output, gate, up, down), mapped to each
family's sub-layer (`CausalFamily.projections`). The run folder's checkpoints hold the
adapters and the step's state, not the frozen weights: the model rebuilt from the
folder the run recorded (`pretrained.json`, its weights' SHA-256, also in each checkpoint)
gets them back.
"""

import dataclasses
import math

import numpy as np

from amptrain.config import TrainConfig, require

# The projections `train.lora_targets` may name (each family maps them: families/).
LORA_PROJECTIONS = ("query", "key", "value", "output", "gate", "up", "down")
# How `train.base_weights` may hold the frozen base (base_weights.py holds it so).
BASE_WEIGHTS = ("float32", "compute", "int8", "int4")


@dataclasses.dataclass(frozen=True)
class LoraTrainConfig(TrainConfig):
    """`[train]` of the language model: the keys every task has, and LoRA's."""

    # with model.pretrained: > 0 freezes the pretrained weights and trains low-rank adapters
    # of this rank on the projections named in lora_targets, each scaled by
    # lora_alpha / lora_rank (lora_alpha 0: 1); 0 trains every weight
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_targets: str = "query,value"  # of query, key, value, output, gate, up, down
    # with lora_rank > 0, how the frozen pretrained weights are held: "float32" (as loaded),
    # "compute" (in the policy's compute dtype), "int8" or "int4" (each decoder projection
    # quantized by Keras: base_weights.py; embeddings and norms as loaded)
    base_weights: str = "float32"


def check(config):
    """LoRA's keys, refused in one line (`config.require`)."""
    t, m = config.train, config.model
    require(t.lora_rank >= 0, "train.lora_rank", "an integer >= 0 (0: every weight trained)", t.lora_rank)
    require(0 <= t.lora_alpha < math.inf, "train.lora_alpha", "a finite number >= 0 (0: lora_rank)", t.lora_alpha)
    lora_targets(t.lora_targets)
    require(t.base_weights in BASE_WEIGHTS, "train.base_weights", f"one of {', '.join(BASE_WEIGHTS)}", t.base_weights)
    if t.base_weights != "float32":
        require(bool(t.lora_rank), "train.base_weights", '"float32" (the others hold a LoRA run\'s frozen base: '
                "set train.lora_rank)", t.base_weights)  # fmt: skip
    if t.lora_rank:
        require(
            bool(m.pretrained),
            "train.lora_rank",
            "0 (LoRA adapts model.pretrained, a language model's folder)",
            t.lora_rank,
        )


def lora_targets(text, known=LORA_PROJECTIONS):
    """The projection names of `train.lora_targets` ("query,value"), each one of `known`."""
    names = [name.strip() for name in str(text).split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    require(
        bool(names) and not unknown,
        "train.lora_targets",
        f"a comma-separated list of {', '.join(known)}",
        text,
    )
    return names


def target_layers(model, names):
    """The sub-layers `names` stand for in each decoder layer of `model`."""
    return block_layers(model.blocks, model.family.projections, names)


def every_projection(blocks, family):
    """Every projection (the family's seven names) of each of `blocks`."""
    return block_layers(blocks, family.projections, list(family.projections))


def block_layers(blocks, projections, names):
    """The sub-layers `names` stand for in each of `blocks` (`projections`: the family's map)."""
    found = []
    for block in blocks:
        for name in names:
            layer = block
            for attribute in projections[name].split("."):
                layer = getattr(layer, attribute)
            found.append(layer)
    return found


def apply_lora(model, train_config):
    """Freezes `model`'s weights and puts adapters on its targets (nothing when lora_rank is 0)."""
    rank = train_config.lora_rank
    if not rank:
        return
    layers = target_layers(model, lora_targets(train_config.lora_targets, tuple(model.family.projections)))
    for variable in model.weights:
        variable.trainable = False
    alpha = train_config.lora_alpha or rank
    for layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)
    from amptrain.tasks.language_model.projections import lean_projections

    lean_projections(every_projection(model.blocks, model.family))  # every frozen one
    model.lora = {"rank": rank, "alpha": alpha, "targets": train_config.lora_targets}


def adapters(model):
    """The adapters' variables (A and B of each target), in a fixed order."""
    return [v for v in model.weights if v.trainable and "lora_kernel" in v.path]


def merge_lora(model):
    """Each adapted kernel set to kernel + (alpha / rank) A B and its adapter turned off: the
    model computes what it computed, from plain weights, through Keras' own layers (what an
    export holds)."""
    from amptrain.tasks.language_model.projections import keras_projections

    keras_projections(model._flatten_layers(include_self=False))
    for layer in model._flatten_layers(include_self=False):
        if getattr(layer, "lora_enabled", False):
            merged = layer._kernel.numpy() + (layer.lora_alpha / layer.lora_rank) * np.tensordot(
                layer.lora_kernel_a.numpy(), layer.lora_kernel_b.numpy(), axes=1
            )
            layer._kernel.assign(merged.astype(layer._kernel.dtype))
            layer.lora_enabled = False


def checkpoint_view(model, base_weights):
    """What a checkpoint of a model with adapters holds: the adapters, and the SHA-256 of the
    pretrained weights they adapt and how they were held (`base_weights`: "SHA" or "SHA int8")."""
    import tensorflow as tf

    return tf.train.Checkpoint(
        adapters=adapters(model), base_weights=tf.Variable(base_weights or "", trainable=False, name="base_weights")
    )
