"""keras-hub's Hugging Face conversion, taking the weights as `transformers` saves them.

    encoder = load_backbone(family, "tests/pretrained/tiny-roberta", dtype="float32", dropout=0.0, name="enc")
    backbone = load_backbone(family, path, place=placement.start, dtype="bfloat16", name="dec")

keras-hub's converters name RoBERTa's, DistilBERT's and ALBERT's weights as a task model
saves them (`roberta.embeddings...`) and find a prefix only when the file has one more
than they ask for; `RobertaModel.save_pretrained` writes them without it. The loader here
also drops the converter's prefix when the file has none. The converter is keras-hub's
own (`keras_hub.src.utils.transformers.convert_<family>`), run on the built backbone.

The tensors are read from the file into memory one at a time, not through a memory map
(keras-hub's `safe_open`): a mapped file's pages count in the process's resident set while it
is open, the whole file once every tensor has been read. `place(backbone)` gives the function
that puts each converted tensor into its variable (by default `variable.assign`): how a
quantized base takes its weights without being held whole in float32 first: the backbone is
then built with its float variables deferred (Keras' own deferred initialization, a
`StatelessScope`: a shape and an initializer, no memory), and `place` makes each one.
"""

import contextlib
import importlib
import json
import os
import struct

import numpy as np

# safetensors' dtype names -> numpy's (bfloat16: ml_dtypes', as Keras reads it)
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip


def load_backbone(family, path, place=None, **kwargs):
    """The family's keras-hub backbone built from the folder's config.json (with the family's
    corrections: `CausalFamily.backbone_arguments`) and its weights converted into it;
    `place(backbone)`: the function (variable, value) that makes each weight's variable, the
    backbone's float variables deferred until it does (None: built whole, each weight assigned)."""
    import keras_hub

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    backbone = getattr(keras_hub.models, family.backbone)
    with _deferring(place is not None):
        encoder = backbone.from_preset(path, load_weights=False, **kwargs, **family.backbone_arguments(config))
    converter = importlib.import_module(f"keras_hub.src.utils.transformers.{family.converter}")
    with _loader()(path) as loader:
        loader.place = place(encoder) if place else _assign
        converter.convert_weights(encoder, loader, config)
    return encoder


class SafetensorsFile:
    """One .safetensors file read a tensor at a time (`keys()`, `get_tensor(key)`: a new array)."""

    def __init__(self, path):
        self.path = path
        self.file = open(path, "rb")  # noqa: SIM115 - closed by the loader's exit stack
        (size,) = struct.unpack("<Q", self.file.read(8))
        self.header = json.loads(self.file.read(size))
        self.header.pop("__metadata__", None)
        self.start = 8 + size

    def keys(self):
        return self.header.keys()

    def get_tensor(self, key):
        entry = self.header[key]
        begin, end = entry["data_offsets"]
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{self.path}: tensor {key}: dtype {entry['dtype']} is not one amptrain reads")
        if dtype == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        array = np.empty(entry["shape"], np.dtype(dtype).newbyteorder("<"))
        if array.nbytes != end - begin:
            raise ValueError(f"{self.path}: tensor {key}: {end - begin} bytes for shape {entry['shape']}")
        self.file.seek(self.start + begin)
        if self.file.readinto(memoryview(array.reshape(-1).view(np.uint8))) != array.nbytes:
            raise ValueError(f"{self.path}: tensor {key}: the file ends before its {array.nbytes} bytes")
        return array


@contextlib.contextmanager
def _deferring(defer):
    """The float variables made inside left uninitialized (a shape and an initializer, as Keras
    defers them in a `StatelessScope`): the caller makes each one. The others (a dropout's seed
    state) are made on leaving. Keras' list of variables to initialize is given back as it was,
    so that no later scope's exit allocates the deferred ones."""
    if not defer:
        yield
        return
    import keras
    from keras.src.backend.common import global_state

    before = list(global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True))
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        made = global_state.get_global_attribute("uninitialized_variables")[len(before) :]
        global_state.set_global_attribute("uninitialized_variables", before)
    for variable in made:
        if "float" not in variable.dtype:
            variable._deferred_initialize()


def _assign(variable, value):
    variable.assign(value)


def _loader():
    from keras_hub.src.utils.preset_utils import SAFETENSOR_FILE, get_file
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

    class Loader(SafetensorLoader):
        def get_prefixed_key(self, hf_weight_key, dict_like):
            key = super().get_prefixed_key(hf_weight_key, dict_like)
            head, _, rest = hf_weight_key.partition(".")
            if key not in dict_like.keys() and rest and head in ("roberta", "distilbert", "albert", "bert"):
                return super().get_prefixed_key(rest, dict_like)
            return key

        def get_tensor(self, hf_weight_key):  # keras-hub's, read by SafetensorsFile
            if self.safetensor_config is None:
                fname = self.fname if self.fname is not None else SAFETENSOR_FILE
            else:
                weight_map = self.safetensor_config["weight_map"]
                fname = weight_map[self.get_prefixed_key(hf_weight_key, weight_map)]
            if fname not in self.safetensor_files:
                file = SafetensorsFile(get_file(self.preset, fname))
                self.callback(file.file.close)
                self.safetensor_files[fname] = file
            file = self.safetensor_files[fname]
            return file.get_tensor(self.get_prefixed_key(hf_weight_key, file))

        def port_weight(self, keras_variable, hf_weight_key, hook_fn=None):  # keras-hub's, stored by `place`
            tensor = self.get_tensor(hf_weight_key)
            if hook_fn:
                tensor = hook_fn(tensor, list(keras_variable.shape))
            self.place(keras_variable, tensor)

    return Loader
