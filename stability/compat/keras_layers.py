"""Every layer of a Keras model at any depth: the one module that uses a private Keras API.

Keras 3 has no public walk over nested layers: ``Model.layers`` lists only the top level,
and a custom layer's sublayers (the seed's ``Net`` inside a message-passing layer) are
tracked privately. The replay needs their names to read ``check_numerics`` name scopes, so
this calls ``Layer._flatten_layers``; ``tests/test_private_apis.py`` fails loudly when a
Keras release removes or changes it.
"""

from __future__ import annotations

import keras

#: The private Keras method this module relies on; the test checks it exists.
PRIVATE_API = "_flatten_layers"


def layer_names(model: keras.Layer) -> set[str]:
    """Names of ``model``'s layers at every depth (``net``, ``message_passing_0``, ...)."""
    return {layer.name for layer in nested_layers(model)}


def nested_layers(layer: keras.Layer) -> list[keras.Layer]:
    """``layer``'s sublayers at every depth, in Keras' tracking order (``layer`` left out).

    The doctor's kernel-constraint remedy (``stability.model.remedies``) finds the ``Dense``
    layers inside a failing layer with it."""
    flatten = getattr(layer, PRIVATE_API, None)
    if flatten is None:
        raise RuntimeError(
            f"keras {keras.__version__}: Layer.{PRIVATE_API} is gone; "
            "stability.compat.keras_layers needs a new way to walk nested layers"
        )
    return list(flatten(include_self=False))


def layer_at(model: keras.Layer, path: str | None) -> keras.Layer:
    """The layer at ``path`` in ``model`` (``message_passing_0`` or ``edge_attention/dense_1``,
    names as a failure names them; the model's own name, or None, is the model itself).
    ``LookupError`` names a path the model does not have."""
    scope: keras.Layer = model
    for part in path.split("/") if path else []:
        inside = [layer for layer in nested_layers(scope) if layer.name == part]
        if not inside:
            if part == model.name and scope is model:  # the model's own call
                continue
            raise LookupError(f"the model has no layer {path!r}")
        scope = inside[0]
    return scope
