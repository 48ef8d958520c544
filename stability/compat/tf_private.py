"""TensorFlow's private behaviour the replay relies on, in one place: each contract here is
checked by a test in ``tests/test_private_apis.py`` that exercises it, so a release that
changes one fails a named test instead of misnaming a failure.

- the text of a ``check_numerics`` error (the node "Detected at", the op type, the first
  input tensor);
- the scope the gradient tape puts a gradient op in (``gradient_tape/<forward scope>``);
- the ``_<n>`` suffix TensorFlow appends to a name scope entered again in one graph;
- ``FuncGraph.captures``, which pairs a captured variable's handle with its placeholder;
- turning op determinism off and reading it (tests that compile with XLA after a run turned
  it on).
"""

from __future__ import annotations

import re
from typing import Any

#: The scope TensorFlow's tape puts a gradient op in: ``gradient_tape/<forward op's scope>``.
GRADIENT_SCOPE = "gradient_tape"

_NODE = re.compile(r"Detected at node (\S+?)/CheckNumerics\w*")
_OP = re.compile(r'of (?:graph )?op "(\w+)"')
_INPUT = re.compile(r'Tensor\("([^"]+)"')


def error_node(message: str) -> str | None:
    """The failing node a ``check_numerics`` error names ("Detected at node ..."), or None
    where TensorFlow attached no traceback."""
    node = _NODE.search(message)
    return node.group(1) if node else None


def error_op_type(message: str) -> str | None:
    """The type of the op a ``check_numerics`` error is about (``Exp``, ``RealDiv``)."""
    op = _OP.search(message)
    return op.group(1) if op else None


def error_first_input(message: str) -> str | None:
    """The name of the first input tensor a ``check_numerics`` error lists."""
    tensor = _INPUT.search(message)
    return tensor.group(1) if tensor else None


def strip_uniquifier(part: str, known: set[str]) -> str:
    """``message_passing_0_1`` -> ``message_passing_0``: TensorFlow uniquifies a name scope
    that is entered again in the same graph by appending ``_<n>``.

    In a traced graph Keras enters each layer's scope twice (its ops sit in the second), so
    a layer's ops carry one suffix: two sibling layers ``edge_attention`` and
    ``edge_attention_1`` run in ``edge_attention_1`` and ``edge_attention_1_2``. A part that
    is a known name plus one suffix is therefore that name's layer, even where the part is
    itself a known name (``tests/test_private_apis.py`` checks the double entry)."""
    base, _, number = part.rpartition("_")
    if number.isdigit() and base in known:
        return base
    return part


def captured_handles(graph: Any) -> dict[int, Any]:
    """``id(placeholder) -> captured tensor`` of a traced function's graph: a variable read in
    the function is captured by its handle."""
    return {id(internal): external for external, internal in graph.captures}


def is_gradient_op(name: str) -> bool:
    """Whether op ``name`` is one the gradient tape made."""
    return name.startswith(GRADIENT_SCOPE + "/")


def op_determinism_enabled() -> bool:
    """Whether TensorFlow's op determinism is on (``tf.config.experimental`` can only turn
    it on)."""
    from tensorflow.python.framework import config as tf_config

    return bool(tf_config.is_op_determinism_enabled())


def disable_op_determinism() -> None:
    """Turn TensorFlow's op determinism off: Keras compiles ``jit_compile=True`` with XLA only
    while it is off, and TensorFlow has no public switch for it."""
    from tensorflow.python.framework import config as tf_config

    tf_config.disable_op_determinism()
