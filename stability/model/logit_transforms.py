"""Logit transforms: a function applied to every attention logit before the segment softmax.

``create_recipe(ctx, logit_transform="name")`` picks one by name; ``"none"`` (the default)
leaves the logits as ``Net`` computed them. Register your own in a plugin::

    import tensorflow as tf
    from stability import register_logit_transform

    @register_logit_transform
    def tanh_squash(logits: tf.Tensor) -> tf.Tensor:
        return 10.0 * tf.tanh(logits / 10.0)  # |logit| < 10: exp can neither overflow nor vanish

Shapes: ``[num_edges, 1]`` -> ``[num_edges, 1]``. The sentinel watches the transformed logits
(they are what ``exp`` sees).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stability.core.errors import NameNotFound
from stability.core.registration import check_new_name

LogitTransform = Callable[[tf.Tensor], tf.Tensor]


def no_transform(logits: tf.Tensor) -> tf.Tensor:
    """The logits unchanged (the seed)."""
    return logits


_transforms: dict[str, LogitTransform] = {"none": no_transform}  # name -> transform


def register_logit_transform(fn: LogitTransform | None = None, *, name: str | None = None) -> Any:
    """Decorator: register ``fn`` as the logit transform ``name`` (default: its function name)."""

    def decorate(transform: LogitTransform) -> LogitTransform:
        key = name or transform.__name__
        check_new_name("logit transform", key, _transforms.get(key), transform)
        _transforms[key] = transform
        return transform

    return decorate(fn) if fn is not None else decorate


def get_logit_transform(name: str) -> LogitTransform:
    """The logit transform called ``name``."""
    if name not in _transforms:
        raise NameNotFound("logit transform", name, _transforms)
    return _transforms[name]


def list_logit_transforms() -> list[str]:
    return sorted(_transforms)
