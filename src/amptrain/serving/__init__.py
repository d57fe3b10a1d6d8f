"""What every served task shares, below the tasks: the base of a task's serving graph
(`modules.ServingModule`), Python's character classes for graphs (`unicode_classes`), the
HTTP server that speaks TF Serving's REST API (`server`, `rest`, `tensors`, `batcher`,
`versions`), and an export read back (`served`, `streaming`). Writing an export of a run
is `amptrain.exports`, above the tasks and the engine.
"""
