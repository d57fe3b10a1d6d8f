"""What every task's serving module shares: the model's variables kept for saving, and
the two signatures a SavedModel gets.

A module holds the Keras model's variables (the float32 master weights) as plain
`tf.Variable`s, not the Keras model itself: the SavedModel is then graphs and variables
only, and `tf.saved_model.load` needs neither Keras nor amptrain (nor `safe_mode=False`).
Each task's module defines `serve` (raw strings in) and `serve_ids` (token ids in) as
`tf.function`s with input signatures.
"""

import tensorflow as tf

SERVING_DEFAULT = "serving_default"
SERVING_IDS = "serve_token_ids"


class ServingModule(tf.Module):
    """A task's serving graph. A subclass defines `serve` and `serve_ids` (`tf.function`s with
    input signatures) and `records(texts, outputs, metadata)`, which turns `serve`'s outputs
    into `amptrain predict`'s records."""

    converts_to_onnx = True  # its token-ids graph converts (`amptrain export --format onnx`)
    onnx_refusal = ""  # why not, when it does not
    # {count output: (outputs padded to the batch's largest count)}: the server cuts each
    # request's rows back to its own largest (`serving.batcher.own_rows`); the export's metadata
    # records it
    padded_by = {}

    def __init__(self, model):
        super().__init__()
        self.model = model  # not tracked (below): only its variables go into the SavedModel
        self.weights = [v.value if hasattr(v, "value") else v for v in model.variables]

    def __setattr__(self, name, value):
        if name == "model":  # a Keras model would be saved as objects needing Keras to rebuild
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def signatures(self):
        """{signature name: concrete function} for `tf.saved_model.save`."""
        return {
            SERVING_DEFAULT: self.serve.get_concrete_function(),
            SERVING_IDS: self.serve_ids.get_concrete_function(),
        }

    @staticmethod
    def records(texts, outputs, metadata):
        """One JSON-ready record a text from the `serving_default` outputs."""
        raise NotImplementedError

    @staticmethod
    def answer(loaded, metadata, overrides=()):
        """texts (a string tensor) -> `serve`'s outputs, for `predict EXPORT`. `overrides`:
        settings given on the command line (`generate.temperature=0.8`); an export that takes
        none refuses them in one line, never drops them."""
        if overrides:
            from amptrain.errors import UserError

            keys = ", ".join(key for key, _ in overrides)
            raise UserError(f"{keys}: this export ({metadata.get('task')}) takes no such setting; leave it out")
        return lambda texts: loaded.signatures[SERVING_DEFAULT](text=texts)

    def describe(self):
        """What the export's metadata file says of the signatures beyond their specs."""
        return {
            "signatures": {SERVING_DEFAULT: "raw strings", SERVING_IDS: "token ids"},
            "padded_by": {count: list(names) for count, names in self.padded_by.items()},
        }
