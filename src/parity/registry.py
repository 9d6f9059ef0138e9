"""One generic name -> object registry, with did-you-mean and plugins from entry points."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from parity.errors import ParityError, did_you_mean

T = TypeVar("T")


def split_ref(ref: str) -> tuple[str, str]:
    """`package.module:attr` (or `package.module.attr`) as (module, attr)."""
    module_name, sep, attr = ref.partition(":")
    if not sep:
        module_name, _, attr = ref.rpartition(".")
    return module_name, attr


def import_object(ref: str, what: str = "object"):
    """Import `package.module:attr` (or `package.module.attr`); a ParityError says what went wrong."""
    module_name, attr = split_ref(ref)
    if not module_name or not attr or module_name.startswith("."):
        raise ParityError(f"{what} '{ref}' must look like 'package.module:name' (an absolute module path)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ParityError(f"cannot import module '{module_name}' for {what} '{ref}': {exc}") from exc
    except Exception as exc:  # the module's own code raised while importing: the user's to fix
        raise ParityError(f"importing module '{module_name}' for {what} '{ref}' raised "
                          f"{type(exc).__name__}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            raise ParityError(f"module '{module_name}' has no attribute '{attr}'{did_you_mean(attr, names)}")
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Names to objects. Built-ins register lazily (a loader per name keeps heavy imports away until
    used); plugins come from the entry-point group `group`; `pkg.module:Name` references import directly."""

    def __init__(self, kind: str, group: str | None = None):
        self.kind = kind
        self.group = group
        self._loaders: dict[str, Callable[[], T]] = {}
        self._loaded: dict[str, T] = {}
        self._plugins_scanned = False

    def register(self, name: str, loader: Callable[[], T]) -> None:
        self._loaders[name] = loader

    def _scan_plugins(self) -> None:
        if self._plugins_scanned or self.group is None:
            return
        self._plugins_scanned = True
        for ep in entry_points(group=self.group):
            self._loaders.setdefault(ep.name, ep.load)

    def names(self) -> list[str]:
        self._scan_plugins()
        return sorted(self._loaders)

    def get(self, name: str) -> T:
        if name in self._loaded:
            return self._loaded[name]
        self._scan_plugins()
        if name in self._loaders:
            obj = self._loaders[name]()
        elif ":" in name:
            obj = import_object(name, self.kind)
        else:
            known = ", ".join(self.names())
            raise ParityError(f"unknown {self.kind} '{name}'{did_you_mean(name, self.names())} (known: {known})")
        self._loaded[name] = obj
        return obj
