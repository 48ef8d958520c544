"""Logit transforms: a function applied to every attention logit before the segment softmax.

``create_recipe(ctx, logit_transform="name")`` picks one by name; ``"none"`` (the default)
leaves the logits as ``Net`` computed them, and ``"tanh_cap"`` bounds them (the doctor's
logit-transform remedy). Register your own in a plugin::

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

from stability.core.registry import Registry

LogitTransform = Callable[[tf.Tensor], tf.Tensor]


def no_transform(logits: tf.Tensor) -> tf.Tensor:
    """The logits unchanged (the seed)."""
    return logits


#: The bound of ``tanh_cap``: ``exp(5) * 256`` edges into one node is 38,000, below even
#: float16's largest 65,504, and ``exp(-5)`` is far above every dtype's smallest normal.
TANH_CAP = 5.0


def tanh_cap(logits: tf.Tensor) -> tf.Tensor:
    """``5 tanh(logit / 5)``: every logit inside (-5, 5), so the naive softmax's ``exp`` can
    neither overflow nor vanish; near 0 the logits are unchanged (tanh(x) ~ x)."""
    return TANH_CAP * tf.tanh(logits / TANH_CAP)


_transforms: Registry[LogitTransform] = Registry(  # name -> transform
    "logit transform", {"none": no_transform, "tanh_cap": tanh_cap}
)


def register_logit_transform(fn: LogitTransform | None = None, *, name: str | None = None) -> Any:
    """Decorator: register ``fn`` as the logit transform ``name`` (default: its function name)."""
    return _transforms.register(fn, name=name)


def get_logit_transform(name: str) -> LogitTransform:
    """The logit transform called ``name``."""
    return _transforms.get(name)


def list_logit_transforms() -> list[str]:
    return _transforms.names()
