"""Plugins: the user's own modules that register variants, data sets, softmaxes and logit
transforms, named by module (``my_fixes``) or by a ``.py`` file (``my_fixes.py``,
``../lib/my_fixes.py``, an absolute path).

A file is imported as the module named by its stem, with its folder put on ``sys.path``:
so a spawned worker (``--workers``) imports it by that name too, like any module.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from stability.core.errors import NameNotFound, StabilityError

_loaded: list[str] = []  # plugins imported so far, as the user named them


def is_path(spec: str) -> bool:
    """Whether ``spec`` names a file rather than a module."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def load_plugin(spec: str, base_dir: Path | None = None) -> str:
    """Import the plugin ``spec`` (a module name, or a ``.py`` path relative to ``base_dir``,
    default the working folder) and return its module name."""
    name = import_spec(spec, base_dir)
    if spec not in _loaded:
        _loaded.append(spec)
    return name


def import_spec(spec: str, base_dir: Path | None = None, what: str = "plugin") -> str:
    """Import ``spec``, a module name or a ``.py`` path relative to ``base_dir`` (default
    the working folder), and return its module name; a one-line ``StabilityError`` naming
    ``what`` it was (a plugin, a conformance target) when it cannot be imported."""
    if is_path(spec):
        return _import_file(spec, base_dir, what)
    # The working folder is importable, as with `python -m`, so a module beside the case
    # files can be named without installing it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return _import(spec, spec, what)


def loaded_plugins() -> list[str]:
    """The plugins imported so far (since ``forget_loaded``), as they were named."""
    return list(_loaded)


def plugin_hint(error: StabilityError) -> str:
    """``error``'s message, with a pointer to --plugin when it is an unknown variant or data
    set and no plugin was loaded: the usual reason a user's own name is unknown."""
    if not isinstance(error, NameNotFound) or error.kind not in ("variant", "data set"):
        return str(error)
    if _loaded:
        return str(error)
    return (
        f"{error} If your own module registers this {error.kind}, name it with "
        '--plugin my_module.py or plugins = ["my_module.py"] in the case file.'
    )


def forget_loaded() -> None:
    """Start a new count of loaded plugins (each command line counts its own); the modules
    stay imported."""
    _loaded.clear()


def _import_file(spec: str, base_dir: Path | None, what: str) -> str:
    path = Path(spec)
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    path = path.resolve()
    if path.suffix != ".py" or not path.is_file():
        raise StabilityError(
            f"{what} {spec!r}: no such .py file ({path}); expected a module name or a path to "
            "a .py file"
        )
    name = path.stem
    if not name.isidentifier():
        raise StabilityError(
            f"{what} {spec!r}: {path.name} cannot be imported as a module; rename it to "
            "letters, digits and _"
        )
    existing = sys.modules.get(name)
    if existing is not None:
        origin = getattr(existing, "__file__", None)
        if origin is not None and Path(origin).resolve() == path:
            return name
        raise StabilityError(
            f"{what} {spec!r}: a module named {name!r} is already imported from "
            f"{origin or 'Python itself'}; rename {path.name}"
        )
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return _import(spec, name, what)


def _import(spec: str, name: str, what: str) -> str:
    try:
        importlib.import_module(name)
    except StabilityError as exc:  # the plugin's own registration refused something
        raise StabilityError(f"{what} {spec!r}: {exc}") from None
    except Exception as exc:
        raise StabilityError(
            f"{what} {spec!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return name
