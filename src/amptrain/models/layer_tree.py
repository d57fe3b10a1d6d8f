"""Walking a Keras model's layer tree.

    for layer in walk(model): ...          # the model, then every nested layer, depth first
    children(layer)                        # its direct sublayers

Keras 3 lists a layer's direct sublayers only through the private `_flatten_layers`
(`Model.layers` is that call); this is the one place that depends on it.
"""


def children(layer):
    return list(layer._flatten_layers(include_self=False, recursive=False))


def walk(layer):
    yield layer
    for child in children(layer):
        yield from walk(child)
