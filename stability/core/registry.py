"""One registry type for every kind of named thing a user can add: variants, data sets,
softmaxes and logit transforms.

A ``Registry`` is a plain private dict, name -> entry, filled by a decorator. Its rule: a name
belongs to the first function registered under it (re-registering the same function, as a
re-imported plugin does, is allowed); an unknown name raises ``NameNotFound`` with a "did
you mean" suggestion.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from stability.core.errors import NameNotFound, StabilityError

T = TypeVar("T")


def qualified(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of ``fn``: how a registration names its owner."""
    return f"{fn.__module__}.{fn.__qualname__}"


class Registry(Generic[T]):
    """Entries of one ``kind`` ("variant", "data set", ...) by name.

    ``register`` stores a function as its own entry; ``add`` stores any entry (a ``Variant``
    record, say) on behalf of the function that owns it.
    """

    def __init__(self, kind: str, builtins: Mapping[str, Any] | None = None):
        self.kind = kind
        self._entries: dict[str, T] = {}  # name -> entry
        self._owners: dict[str, str] = {}  # name -> qualified name of the registering function
        for name, entry in (builtins or {}).items():
            self.add(name, entry, owner=entry)

    def add(self, name: str, entry: T, *, owner: Callable[..., Any]) -> None:
        """Store ``entry`` under ``name``, unless another function already holds the name."""
        old = self._owners.get(name)
        if old is not None and old != qualified(owner):
            raise StabilityError(
                f"{self.kind} {name!r} is already registered by {old}; choose another name"
            )
        self._entries[name] = entry
        self._owners[name] = qualified(owner)

    def register(self, fn: Any = None, *, name: str | None = None) -> Any:
        """Decorator, bare or with ``name=``: register ``fn`` under ``name`` (default: its
        function name) and return it unchanged."""

        def decorate(function: Any) -> Any:
            self.add(name or function.__name__, function, owner=function)
            return function

        return decorate(fn) if fn is not None else decorate

    def get(self, name: str) -> T:
        """The entry called ``name``; an unknown name raises ``NameNotFound`` with a suggestion."""
        if name not in self._entries:
            raise NameNotFound(self.kind, name, self._entries)
        return self._entries[name]

    def entries(self) -> list[T]:
        """Every entry, in the order registered."""
        return list(self._entries.values())

    def names(self, filter: str | None = None) -> list[str]:
        """Registered names in order, optionally those containing ``filter``."""
        return [n for n in sorted(self._entries) if filter is None or filter in n]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def copy(self) -> Registry[T]:
        """An independent registry holding the same entries (tests register into a copy)."""
        twin: Registry[T] = Registry(self.kind)
        twin._entries, twin._owners = dict(self._entries), dict(self._owners)
        return twin
