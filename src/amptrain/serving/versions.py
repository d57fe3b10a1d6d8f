"""The versions of an export folder that `amptrain serve` answers for, as TF Serving's
file-system source sees them: numbered folders, the newest served by default, and a new
one picked up when it appears.

    versions = Versions("runs/classify-spam/export", batching={"max_batch_size": 32, "max_wait_ms": 5})
    versions.newest.version              # 1: loaded (and warmed up) at once
    await versions.get(2)                # another version folder, loaded at its first request
    versions.refresh()                   # a poll: serves what is on disk now

A version is one `tf.saved_model.load` (`served.py` reads its metadata), its `serving_default`
signature, and its own `Batcher`. `amptrain export` writes a version under `N.partial` and
renames it when complete, so a folder with a `saved_model.pb` is whole when the poll sees it.
What is served follows the disk: a removed version is unloaded, and when it was the default
the newest remaining one becomes it. A folder that does not load is named once, and tried
again only when its `saved_model.pb` changes.
"""

import asyncio
import os
import threading

from amptrain.errors import UserError, id_out_of_range, request_fault
from amptrain.serving.batcher import Batcher
from amptrain.serving.rest import INPUT, SIGNATURE, BadRequest
from amptrain.serving.served import SAVED_MODEL_FILE, find_export, load_saved_model, read_metadata


class NotFound(LookupError):
    """A model name or version this server does not have (a 404)."""


class BrokenVersion(UserError):
    """A version folder that does not load. `new`: False when it failed before and has not
    changed since (the poll said so then)."""

    def __init__(self, message, new=True):
        super().__init__(message)
        self.new = new


class Servable:
    """One loaded version: `run(texts)` is a call of its `serving_default`."""

    def __init__(self, path, batching, on_batch=None):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the tokenizer's ops before loading)

        self.path, self.version = path, int(os.path.basename(path)) if os.path.basename(path).isdigit() else 0
        self.metadata = read_metadata(path)
        self._loaded = load_saved_model(path)  # kept: the signatures are its functions
        self.signatures = dict(self._loaded.signatures)
        self._serve = self.signatures.get(SIGNATURE)
        inputs = list(self._serve.structured_input_signature[1]) if self._serve is not None else []
        if inputs != [INPUT]:
            raise UserError(
                f"{path}: its {SIGNATURE} signature takes {inputs or 'nothing'}, not one string input {INPUT!r}; "
                "`amptrain serve` serves what `amptrain export RUN` writes (a Trainer.export() folder is "
                "served by TF Serving itself)"
            )
        self._tf = tf
        self.ids = self.id_signatures()
        self.run(["warm up"])  # the first request does not pay for the graph's first run
        self.batcher = Batcher(self.run, on_batch=on_batch, padded_by=self.padded_by(), **batching)

    def padded_by(self):
        """The export's padded outputs (its metadata; an older export's: its built-in task's
        serving module, as a user's task then had none)."""
        if "padded_by" in self.metadata:
            return self.metadata["padded_by"]
        from amptrain import registry

        task = self.metadata.get("task")
        if not registry.is_builtin(task):
            return {}
        return registry.task_class(task).serving_module.padded_by

    def run(self, texts):
        """{output name: numpy array, a row a text} of `serving_default` on `texts`."""
        outputs = self._serve(**{INPUT: self._tf.constant(texts, self._tf.string)})
        return {name: tensor.numpy() for name, tensor in outputs.items()}

    def id_signatures(self):
        """{name: {input: shape}} of the signatures other than `serving_default` whose inputs
        are all int32 (`serve_token_ids`), for `rest.parse_predict`."""
        found = {}
        for name, function in self.signatures.items():
            specs = function.structured_input_signature[1]
            if name != SIGNATURE and all(spec.dtype == self._tf.int32 for spec in specs.values()):
                found[name] = {k: tuple(spec.shape.as_list()) for k, spec in specs.items()}
        return found

    def call_signature(self, name, tensors):
        """{output name: numpy array} of signature `name` on `tensors` ({input: array}). An id
        beyond its table is the request's fault: a `BadRequest` naming it and the range."""
        try:
            outputs = self.signatures[name](**{k: self._tf.constant(v) for k, v in tensors.items()})
        except self._tf.errors.InvalidArgumentError as error:
            reason = request_fault(str(error))
            if reason is not None:
                raise BadRequest(reason) from None
            found = id_out_of_range(str(error))
            if found is None:
                raise
            where, value, size = found
            raise BadRequest(f"id {value} at [{where}] is out of range: expected 0 <= id < {size}") from None
        return {k: tensor.numpy() for k, tensor in outputs.items()}

    def signature_defs(self):
        """The signatures as TF Serving's metadata lists them: inputs and outputs with dtype and shape."""
        return {
            name: {
                "inputs": {k: _tensor_info(spec) for k, spec in function.structured_input_signature[1].items()},
                "outputs": {k: _tensor_info(spec) for k, spec in function.structured_outputs.items()},
                "method_name": "tensorflow/serving/predict",
            }
            for name, function in self.signatures.items()
        }


def _tensor_info(spec):
    from tensorflow.core.framework import types_pb2

    dims = [{"size": str(-1 if d is None else d), "name": ""} for d in spec.shape.as_list()]
    return {
        "dtype": types_pb2.DataType.Name(spec.dtype.as_datatype_enum),
        "tensor_shape": {"dim": dims, "unknown_rank": False},
    }


def export_folder(path):
    """The folder of version folders that `path` names: itself, a run's `export`, or a
    version folder's parent. A folder with no SavedModel version is one line, naming it."""
    if os.path.isfile(os.path.join(path, SAVED_MODEL_FILE)):
        return os.path.dirname(os.path.abspath(path))
    if os.path.isfile(os.path.join(path, "config.toml")) and os.path.isdir(os.path.join(path, "export")):
        path = os.path.join(path, "export")  # a run folder: its default export
    if find_export(path) is None:  # an ONNX version refused here, in find_export's words
        raise UserError(
            f"{path}: no SavedModel version folder (N/{SAVED_MODEL_FILE}); expected the folder "
            "`amptrain export RUN` writes (RUN/export)"
        )
    return os.path.abspath(path)


def versions_on_disk(folder):
    """The numbers of the complete SavedModel version folders in `folder`, ascending."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit() and os.path.isfile(os.path.join(folder, n, SAVED_MODEL_FILE)))


class Versions:
    def __init__(self, path, batching, on_batch=None):
        self.folder = export_folder(path)
        self._batching, self._on_batch = batching, on_batch
        self._loaded = {}  # version -> Servable
        self._broken = {}  # version -> (its saved_model.pb's mtime, why it did not load)
        self._lock = threading.Lock()  # the poll (a thread) and a request's load (another) meet here
        on_disk = versions_on_disk(self.folder)
        if not on_disk:  # a SavedModel folder not named by a number
            raise UserError(f"{self.folder}: no numbered version folder (N/{SAVED_MODEL_FILE}), as TF Serving expects")
        self.newest = self._load(on_disk[-1])

    def _load(self, version):
        servable = Servable(os.path.join(self.folder, str(version)), self._batching, self._on_batch)
        with self._lock:
            self._loaded[version] = servable
        return servable

    def loaded(self):
        """{version: Servable} of the versions loaded now."""
        with self._lock:
            return dict(self._loaded)

    async def get(self, version=None):
        """The newest version (`version` None), else that version, loaded at its first request."""
        if version is None:
            return self.newest
        servable = self.loaded().get(version)
        if servable is not None:
            return servable
        if version not in versions_on_disk(self.folder):
            raise NotFound(f"version {version} not found in {self.folder}; versions: {versions_on_disk(self.folder)}")
        try:
            return await asyncio.to_thread(self._try_load, version)
        except BrokenVersion as broken:
            raise NotFound(f"version {version} is not available: {broken}") from None

    def refresh(self):
        """A poll (blocking: run it off the event loop): serves by default the newest version
        folder on disk that loads (a newer one, or the newest remaining when the default's
        folder is gone) and forgets loaded versions whose folders are gone (the default kept
        while no other is on disk). Returns (the servables forgotten, for their batchers to be
        closed; the folders that failed to load this poll, one line each)."""
        on_disk = versions_on_disk(self.folder)
        failed = []
        for version in reversed(on_disk):
            if version == self.newest.version or (version < self.newest.version and self.newest.version in on_disk):
                break
            try:
                self.newest = self.loaded().get(version) or self._try_load(version)
                break
            except BrokenVersion as broken:
                if broken.new:
                    failed.append(str(broken))
        with self._lock:
            gone = [v for v in self._loaded if v not in on_disk and v != self.newest.version]
            return [self._loaded.pop(v) for v in gone], failed

    def _try_load(self, version):
        """`_load(version)`, or `BrokenVersion`: at once, not `new`, when its folder failed
        before and has not changed since."""
        stamp = _stamp(os.path.join(self.folder, str(version), SAVED_MODEL_FILE))
        known = self._broken.get(version)
        if known is not None and known[0] == stamp:
            raise BrokenVersion(known[1], new=False)
        try:
            return self._load(version)
        except UserError as error:
            self._broken[version] = (stamp, str(error))
            raise BrokenVersion(str(error)) from None


def _stamp(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
