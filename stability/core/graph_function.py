"""``tf.function`` as the harness compiles every function it traces: without autograph.

Keras 3 compiles its own train step with ``tf.autograph.experimental.do_not_convert`` (and
``keras`` is on autograph's do-not-convert list), so a model's ``call`` that trains under
``model.fit`` is never rewritten by autograph: its Python ``if`` and ``for`` run at trace
time. The harness traces the same way, for two reasons: a model the harness trains is
traced as ``fit`` would trace it (a ``call`` that needs autograph fails in both, not only in
``fit``), and autograph's source-to-source rewrite of every function the step calls cost
about two seconds a training (``python -m stability run`` of a two-run case: 17.0 s with
autograph, 13.3 s without, same rows). Straight-line code traces to the same ops either way.
"""

from collections.abc import Callable
from typing import Any

import tensorflow as tf


def graph_function(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``tf.function(fn, autograph=False, **options)``; with no ``fn``, a decorator."""
    if fn is None:
        return lambda f: tf.function(f, autograph=False, **options)
    return tf.function(fn, autograph=False, **options)
