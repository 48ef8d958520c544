"""The harness's own errors: each one is a one-line message for the user, never a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class StabilityError(ValueError):
    """Bad input from the user (a case file, data, a flag, a name); the CLI exits with code 2."""


class CaseError(StabilityError):
    """A case file that cannot be read or does not validate."""


class NameNotFound(StabilityError):
    """An unknown registry name (variant, data set, softmax), with a "did you mean" suggestion."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        known = sorted(known)
        hint = did_you_mean(name, known)
        super().__init__(f"unknown {kind} {name!r}.{hint} Known: {', '.join(known)}.")
        self.kind, self.name, self.known = kind, name, known


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    """`` Did you mean 'x'?`` for the known name closest to ``name``, or "" when none is;
    ``prefix`` goes before the name (a case key's table: ``dataset.'seed'``)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean {prefix}{close[0]!r}?" if close else ""


class ModelError(StabilityError):
    """A variant's model that cannot train on the case's data (``stability.train.probe``)."""


class DataError(StabilityError):
    """Graph data that is malformed before any training happens."""


class RemedyError(StabilityError):
    """A doctor's remedy that cannot be applied to a variant (a softmax remedy on a model
    with no registered softmax, say): the doctor reports it as not applicable."""
