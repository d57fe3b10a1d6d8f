"""What a training step needs in memory, counted from the model before anything trains.

    estimate = estimate_step(trainer, model, task.signature(), 128, "mixed_bfloat16", optimizer)
    estimate.total(batch_size)          # bytes: fixed + weights + slots + the step's (gradients in it)
    estimate.largest_batch(4 * 2**30)   # the largest multiple of 8 under a budget
    estimate.run_total(8)               # the steps' total or an evaluation's, the larger
    estimate.kept_by_kind()             # what the backward pass keeps a row, by op and dtype

The weights, the gradients (float32, one a trainable variable) and the optimizer's slots are
the variables' own sizes; the gradients, the step's outputs, are counted in its peak. A row's
activations come from the training step's graph, traced once a batch size (twice: the
difference is what a row costs, the rest is batch-independent, such as the gradients and the
weights cast to the compute dtype): the step's operations are run in the order a
first-in-first-out ready queue gives, as TensorFlow's executor does, each tensor alive from
the operation that makes it to the last one that reads it (an op that aliases its input,
a reshape or an identity, extends its input's life instead of allocating), and the peak of
the bytes alive is the step's. It counts what the backward pass keeps (the tensors of the
forward pass it reads) and the backward pass's own temporaries at their largest.

What it cannot see: the runtime itself (TensorFlow, the thread pools, oneDNN's kernels and
caches, the step's traced and instantiated graphs), measured here as this process's resident
memory with the model built and its step run once at a row (its freed pages given back),
without its weights; the allocator's slack; kernels that write a copy the graph does not show.
"""

import collections
import dataclasses
import math

# Ops whose output is (or may be) a view of their first input: no new buffer.
_ALIASES = {"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot"}
# Ops whose output is not the step's to allocate (variables, their reads, constants, inputs).
_FREE = {"ReadVariableOp", "VarHandleOp", "Const", "Placeholder", "NoOp", "AssignVariableOp"}
# The `Estimate` fields counted from the variables, and their names in a record.
VARIABLE_RECORD = {
    "parameters": "parameters",
    "trainable_parameters": "trainable_parameters",
    "weights": "weights_bytes",
    "gradients": "gradients_bytes",
    "slots": "optimizer_slots_bytes",
    "trainable_weights": "trainable_weights_bytes",
    "weights_by_dtype": "weights_bytes_by_dtype",
}


@dataclasses.dataclass
class Estimate:
    """Bytes of one training step at any batch size: `fixed + weights + slots + static + rows x
    per_row`, the gradients within the step's peak (`static`): the step holds each from the op
    that makes it to its end, while the backward pass frees activations. `kept`: {"op-type
    dtype": bytes a row} the backward pass keeps."""

    policy: str
    weights: int
    gradients: int
    slots: int
    static: int  # batch-independent tensors of the step (the gradients, weights cast to the compute dtype, ...)
    per_row: float  # the step's peak of tensors alive, a row
    kept_per_row: float  # of which the forward pass's tensors the backward pass keeps
    fixed: int  # the runtime's own memory before the first step
    parameters: int
    trainable_parameters: int
    kept: dict = dataclasses.field(default_factory=dict)
    trainable_weights: int = 0  # of `weights`, the trained ones' (LoRA: the adapters)
    weights_by_dtype: dict = dataclasses.field(default_factory=dict)  # {"int8": bytes, ...}: a quantized base
    function_measured: bool = False  # `fixed` holds the step's instantiated function
    evaluation: dict = dataclasses.field(default_factory=dict)  # {part: bytes}: `Task.evaluation_memory`

    def total(self, batch_size):
        return int(self.fixed + self.weights + self.slots + self.static + batch_size * self.per_row)

    def run_total(self, batch_size):
        """The run's peak: its steps', or an evaluation's that holds more (generated replies)."""
        evaluating = self.fixed + self.weights + self.slots + sum(self.evaluation.values())
        return int(max(self.total(batch_size), evaluating))

    def largest_batch(self, budget, multiple=8):
        """The largest batch (a multiple of `multiple`) whose total stays under `budget`, or 0."""
        room = budget - self.total(0)
        rows = int(room // self.per_row) if self.per_row > 0 and room > 0 else 0
        return rows - rows % multiple

    def kept_by_kind(self):
        return sorted(self.kept.items(), key=lambda item: -item[1])

    def as_record(self, batch_size=None, budget=None):
        record = {
            "policy": self.policy,
            **{name: getattr(self, field) for field, name in VARIABLE_RECORD.items()},
            "step_static_bytes": self.static,
            "activations_bytes_per_row": round(self.per_row),
            "kept_for_backward_bytes_per_row": round(self.kept_per_row),
            "runtime_bytes": self.fixed,
            "runtime_holds_the_step_function": self.function_measured,
        }
        if self.evaluation:
            record["evaluation_bytes"] = dict(self.evaluation)
        if batch_size:
            record.update(batch_size=batch_size, total_bytes=self.total(batch_size))
            record["run_total_bytes"] = self.run_total(batch_size)
        if budget:
            record.update(memory_limit_bytes=budget, largest_batch=self.largest_batch(budget))
        return record


def _nbytes(tensor):
    count = tensor.shape.num_elements()
    return 0 if count is None or tensor.dtype.name in ("resource", "variant") else count * tensor.dtype.size


def _ancestors(ops):
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def graph_memory(graph, loss, outputs):
    """(peak bytes alive, {(op type, dtype): bytes kept for the backward pass}) of a traced step:
    `loss` the forward pass's result, `outputs` what the step returns (the gradients, alive from
    the op that makes each to the step's end: adding their whole size to the step's peak counted
    a full fine-tuning's float32 gradients beside activations already freed when they are made,
    SmolLM2's estimate 5,632 MiB against a 4,656 MiB peak)."""
    forward = _ancestors([loss.op])
    live = _ancestors([t.op for t in outputs])
    ops = [op for op in graph.get_operations() if op.name in live]
    kept = {}  # tensor name -> (op type, dtype, bytes)
    readers = collections.defaultdict(int)
    for op in ops:
        for tensor in op.inputs:
            readers[tensor.name] += 1
            if tensor.op.name in forward and op.name not in forward and tensor.op.type not in _FREE | _ALIASES:
                kept[tensor.name] = (tensor.op.type, tensor.dtype.name, _nbytes(tensor))
    kinds = collections.Counter()
    for kind, dtype, size in kept.values():
        kinds[(kind, dtype)] += size
    for tensor in outputs:
        readers[tensor.name] += 1  # read by the step's caller: never freed within it
    return _simulate(ops, readers), dict(kinds)


def _simulate(ops, readers):
    """The peak bytes alive when `ops` run in ready-queue order (first ready, first run)."""
    producers = {op.name: {t.op.name for t in op.inputs} | {c.name for c in op.control_inputs} for op in ops}
    waiting = {name: len(names) for name, names in producers.items()}
    after = collections.defaultdict(set)
    for op in ops:
        for name in producers[op.name]:
            after[name].add(op)
    ready = collections.deque(op for op in ops if waiting[op.name] == 0)
    buffers, owner, uses, alive, peak = {}, {}, collections.Counter(), 0, 0

    def free_if_unread(buffer):
        nonlocal alive
        if uses[buffer] == 0 and buffer in buffers:
            alive -= buffers.pop(buffer)

    while ready:
        op = ready.popleft()
        for tensor in op.outputs:
            if op.type in _ALIASES and op.inputs:
                owner[tensor.name] = owner.get(op.inputs[0].name, op.inputs[0].name)
            else:
                owner[tensor.name] = tensor.name
                buffers[tensor.name] = 0 if op.type in _FREE else _nbytes(tensor)
                alive += buffers[tensor.name]
            uses[owner[tensor.name]] += readers[tensor.name]
        peak = max(peak, alive)
        for tensor in op.inputs:
            buffer = owner.get(tensor.name, tensor.name)
            uses[buffer] -= 1
            free_if_unread(buffer)
        for tensor in op.outputs:  # read by nothing: freed at once
            free_if_unread(owner[tensor.name])
        for successor in after[op.name]:
            waiting[successor.name] -= 1
            if waiting[successor.name] == 0:
                ready.append(successor)
    return peak


def elements(variable):
    return math.prod(int(d) for d in variable.shape)


def variable_bytes(variables):
    import tensorflow as tf

    return sum(elements(v) * tf.as_dtype(v.dtype).size for v in variables)


def fixed_specs(signature, batch_size, length):
    """`signature`'s specs (features, targets, ...) with the batch and every unknown length set."""
    import tensorflow as tf

    def fix(spec):
        dims = [batch_size] + [length if d is None else d for d in spec.shape[1:]]
        return tf.TensorSpec(dims, spec.dtype)

    return tf.nest.map_structure(fix, signature)


def variable_parts(model, optimizer, weight_average=None):
    """The `Estimate` fields the variables give: the parameters, and the bytes of the weights (by
    dtype, and the trained ones'), the gradients (float32, a trainable variable each) and the
    optimizer's slots with a weight average's copies (`engine.averaging.WeightAverage`, or None)."""
    import tensorflow as tf

    trainable = model.trainable_variables
    extra = list(weight_average.sums) if weight_average is not None else []
    by_dtype = collections.Counter()
    for v in model.variables:
        by_dtype[tf.as_dtype(v.dtype).name] += elements(v) * tf.as_dtype(v.dtype).size
    return {
        "trainable_weights": variable_bytes(trainable),
        "weights_by_dtype": dict(sorted(by_dtype.items(), key=lambda item: -item[1])),
        "parameters": sum(elements(v) for v in model.weights),
        "trainable_parameters": sum(elements(v) for v in trainable),
        "weights": variable_bytes(model.variables),
        "gradients": sum(elements(v) * 4 for v in trainable),
        "slots": variable_bytes(optimizer.variables) + variable_bytes(extra),
    }


def estimate_step(
    trainer, model, signature, length, policy, optimizer, weight_average=None, batches=(8, 16), run_step=True
):
    """The `Estimate` of `trainer`'s training step (an `engine.step_runner.StepRunner`): its
    forward and backward pass (`forward_backward`) traced at two batch sizes of `length`
    positions (at one, the batch-independent part is counted in its rows); `signature` the
    task's (features, targets, token counts); `weight_average`: its copies are kept too;
    `run_step`: run it once at a row before the runtime is measured (`_run_once`)."""
    import tensorflow as tf

    from amptrain.engine.utilisation import resident_memory, return_free_pages

    counted = []
    # A function of its own: the runner's relaxes its shapes (`reduce_retracing`), and this
    # counts at known ones.
    step = tf.function(trainer.forward_backward.python_function, autograph=False)
    for batch_size in batches:
        features, targets = fixed_specs(signature[:2], batch_size, length)
        traced = step.get_concrete_function(features, targets, tf.TensorSpec((), tf.float32))
        loss_sum = traced.structured_outputs[0]
        counted.append(graph_memory(traced.graph, loss_sum, traced.outputs))
    if len(counted) == 1:  # one batch size: its batch-independent part is counted in its rows
        counted.insert(0, (0, {}))
        batches = (0, *batches)
    ran = run_step and _run_once(step, signature, length)  # the runtime below then holds it, as a run's
    # The step run once freed its tensors, but some of their pages stayed in malloc's arenas,
    # and the runtime counted them besides the step's own (SmolLM2's: about 100 MiB).
    return_free_pages()
    (small_peak, small_kept), (large_peak, large_kept) = counted
    rows = batches[1] - batches[0]
    per_row = max(large_peak - small_peak, 0) / rows
    kept = {key: max(size - small_kept.get(key, 0), 0) / rows for key, size in large_kept.items()}
    parts = variable_parts(model, optimizer, weight_average)
    return Estimate(
        policy=policy,
        **parts,
        static=int(max(small_peak - batches[0] * per_row, 0)),
        per_row=per_row,
        kept_per_row=sum(kept.values()),
        fixed=max((resident_memory()[0] or 0) - parts["weights"] - parts["slots"], 0),  # this process's RSS
        function_measured=ran,
        kept={f"{kind} {dtype}": round(size) for (kind, dtype), size in kept.items() if size > 0},
    )


def runtime_growth(run):
    """The resident memory `run()` leaves behind (its freed pages given back before and after):
    what the functions it traced and made keep while they live."""
    from amptrain.engine.utilisation import resident_memory, return_free_pages

    return_free_pages()
    before = resident_memory()[0] or 0
    run()
    return_free_pages()
    return max((resident_memory()[0] or 0) - before, 0)


def _filled(spec):
    import tensorflow as tf

    if spec.dtype == tf.string:
        return tf.fill(spec.shape, "")
    return tf.ones(spec.shape, spec.dtype)


def _run_once(step, signature, length):
    """Calls `step` once on a row of ones (token 1, every position kept): TensorFlow makes a
    function's executable graph at its first call and keeps it while the function lives, as
    much memory again as its traced graph and more (612 MiB for SmolLM2's LoRA step, about
    20 KB a node), none of it a tensor. Returns whether it ran: a model that refuses ones is
    estimated without it."""
    import tensorflow as tf

    features, targets = tf.nest.map_structure(_filled, fixed_specs(signature[:2], 1, length))
    try:
        step(features, targets, tf.constant(1.0))
    except tf.errors.OpError:
        return False
    return True


def run_estimate(model, optimizer, weight_average=None):
    """A run record's `memory`: `variable_parts` under the record's names. A row's activations
    are `amptrain doctor --memory`'s to estimate: tracing the step here would cost every run
    seconds before its first step."""
    parts = variable_parts(model, optimizer, weight_average)
    return {name: parts[field] for field, name in VARIABLE_RECORD.items()}
