"""Where a config file's ``configs`` package comes from, from any folder: ``make_importable``
puts on ``sys.path`` the folder holding ``configs/`` for a file inside a ``configs`` package, else,
when no ``configs`` is importable, the checkout of this ``trip_jax``.
Details: docs/reference.md#config-files.
"""

from __future__ import annotations

import importlib.util
import os
import sys

PACKAGE = "configs"


def _package_root(folder: str) -> str | None:
    """``folder``'s parent if ``folder`` is a ``configs`` package (with ``__init__.py``)."""
    if os.path.basename(folder) == PACKAGE and os.path.isfile(os.path.join(folder,
                                                                           "__init__.py")):
        return os.path.dirname(folder)
    return None


def _checkout() -> str | None:
    """The folder holding this ``trip_jax`` if it also holds a ``configs`` package (a source
    checkout or an editable install), else None."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    return root if _package_root(os.path.join(root, PACKAGE)) else None


def _found() -> str | None:
    """The folder ``import configs`` takes its package from (not importing it), or None."""
    module = sys.modules.get(PACKAGE)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    return os.path.dirname(os.path.dirname(os.path.realpath(origin))) if origin else None


def make_importable(argument: str) -> str | None:
    """Puts the folder that ``configs`` should come from for the config file of ``argument``
    (``PATH[:ARG]``) on ``sys.path`` (first for a file in a ``configs`` package, last for the
    checkout fallback); returns that folder, or None when ``configs`` comes from elsewhere."""
    path = argument.split(":", 1)[0]
    if not path:
        return None
    root = _package_root(os.path.dirname(os.path.realpath(path)))
    if root is not None:
        if _found() != root:
            sys.path.insert(0, root)
        return root
    if _found() is not None:
        return None
    root = _checkout()
    if root is not None and root not in sys.path:
        sys.path.append(root)
    return root
