"""Package namespaces whose names resolve on first use (PEP 562), so importing a package imports none of its modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], removed: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` of ``package``, whose public names are ``exports`` (name -> the module that
    defines it); a name of ``removed`` raises ``ImportError`` naming its replacement (``from ... import`` passes it
    on). Each name is imported on first use and kept in the package's namespace."""
    names = sorted(exports)
    gone = dict(removed or {})

    def getattr_(name: str) -> Any:
        if name in gone:
            raise ImportError(f"{package}.{name} is gone: use {gone[name]}")
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        vars(importlib.import_module(package))[name] = value
        return value

    return getattr_, lambda: names, names
