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


OWN_DISTRIBUTION = "parity"  # the distribution whose entry points register the built-ins


class Registry(Generic[T]):
    """Names to objects, from the entry-point group `group`: parity registers its built-ins there exactly as a
    third-party package registers its plugins (pyproject.toml), and an entry point is imported only when its
    name is first looked up, so that listing names stays cheap. `package.module:Name` references import
    directly. `refresh` rescans the entry points (a package put on sys.path after the first lookup)."""

    def __init__(self, kind: str, group: str):
        self.kind = kind
        self.group = group
        self._loaders: dict[str, Callable[[], T]] | None = None
        self._loaded: dict[str, T] = {}

    def refresh(self) -> None:
        """Forget what was scanned and loaded: the next lookup reads the entry points again."""
        self._loaders = None
        self._loaded.clear()

    def _scan(self) -> dict[str, Callable[[], T]]:
        if self._loaders is None:
            found = entry_points(group=self.group)
            if not any(_distribution(ep) == OWN_DISTRIBUTION for ep in found):
                raise ParityError(
                    f"parity's built-in {self.kind}s are not registered (no '{self.group}' entry points from an "
                    "installed parity): parity registers them through its installed metadata, which is missing or "
                    "older than this source; run `pip install -e .` in parity's folder")
            self._loaders = {ep.name: ep.load for ep in found}
        return self._loaders

    def names(self) -> list[str]:
        return sorted(self._scan())

    def get(self, name: str) -> T:
        if name in self._loaded:
            return self._loaded[name]
        loaders = self._scan()
        if name in loaders:
            try:
                obj = loaders[name]()
            except ImportError as exc:  # a plugin whose package or a library it needs is not installed here
                raise ParityError(f"cannot load {self.kind} '{name}' (entry point in '{self.group}'): {exc}") from exc
        elif ":" in name:
            obj = import_object(name, self.kind)
        else:
            known = ", ".join(self.names())
            raise ParityError(f"unknown {self.kind} '{name}'{did_you_mean(name, self.names())} (known: {known})")
        self._loaded[name] = obj
        return obj


def _distribution(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else None
