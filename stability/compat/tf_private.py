"""TensorFlow's private behaviour the replay relies on, in one place: each contract here is
checked by a test in ``tests/test_private_apis.py`` that exercises it, so a release that
changes one fails a named test instead of misnaming a failure.

- the text of a ``check_numerics`` error (the node "Detected at", the op type, the first
  input tensor);
- the scope the gradient tape puts a gradient op in (``gradient_tape/<forward scope>``);
- the ``_<n>`` suffix TensorFlow appends to a name scope entered again in one graph;
- ``FuncGraph.captures``, which pairs a captured variable's handle with its placeholder;
- turning op determinism off and reading it (tests that compile with XLA after a run turned
  it on);
- op callbacks (``op_callbacks``), which see every op as it is built or run and may replace
  its outputs: the doctor's op guards (``stability.model.op_guard``) rewrite a failing op
  there, first in line, so that a ``check_numerics`` callback added before them checks the
  guarded value and not the raw one; and the gradient tape's record of an op, which a
  callback's outputs do not change: TensorFlow records the replaced outputs as made by the
  original op from its original inputs (``gen_*_ops`` call ``record_gradient`` after the
  callbacks), so ``record_identity`` records them again, as the identity of the guarded
  value, and the tape differentiates the guard (the tape keeps a tensor's last record).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


#: An op callback: ``(op_type, inputs, attrs, outputs, op_name=None, graph=None)`` returns
#: None (outputs unchanged) or the op's new outputs, one per output.
OpCallback = Callable[..., Any]


@contextmanager
def op_callback_first(callback: OpCallback) -> Iterator[None]:
    """Run ``callback`` on every op built (in a ``tf.function``'s trace) or run (eagerly) in
    this thread while the block runs, before any callback already added (so its outputs are
    what ``tf.debugging.enable_check_numerics`` checks). Ops the callback builds itself are
    not passed to any callback (TensorFlow's own guard against recursion)."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import op_callbacks

    def first(
        op_type: str, inputs: Any, attrs: Any, outputs: Any, op_name: Any = None, graph: Any = None
    ) -> Any:
        # TensorFlow hands a callback's None on to the next callback as its outputs, so a
        # callback that leaves an op alone must return the outputs it was given.
        new = callback(op_type, inputs, attrs, outputs, op_name=op_name, graph=graph)
        return outputs if new is None else new

    op_callbacks.add_op_callback(first)
    callbacks = context.context().op_callbacks
    # add_op_callback appends; the guard must come first, so move it to the front.
    callbacks.insert(0, callbacks.pop())
    try:
        yield
    finally:
        op_callbacks.remove_op_callback(first)


def record_identity(outputs: Any, sources: Any) -> None:
    """Record on every active gradient tape that each tensor of ``outputs`` is the identity
    of the matching tensor of ``sources``, replacing the tape's earlier record of it."""
    from tensorflow.python.eager import record

    for output, source in zip(outputs, sources, strict=True):
        record.record_operation("Identity", [output], [source], lambda *grads: list(grads))
