"""One generic name -> object registry, with did-you-mean and plugins from entry points."""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

from parity.errors import ParityError, clip, did_you_mean

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
    directly. `refresh` rescans the entry points (a package put on sys.path after the first lookup).

    Each registry holds one kind of object: `base` (a `package.module:Class` reference, read as entry points are,
    since the bases live in the layers above this one) and `classes` (the registry holds subclasses of it, else
    instances). What a lookup loads is checked against it before anything uses it: anything else is refused in
    one line that names where it came from."""

    def __init__(self, kind: str, group: str, base: str, classes: bool = False):
        self.kind = kind
        self.group = group
        self.base = base
        self.classes = classes
        self._entry_points: dict[str, EntryPoint] | None = None
        self._loaded: dict[str, T] = {}

    def refresh(self) -> None:
        """Forget what was scanned and loaded: the next lookup reads the entry points again."""
        self._entry_points = None
        self._loaded.clear()

    def _scan(self) -> dict[str, EntryPoint]:
        if self._entry_points is None:
            found = entry_points(group=self.group)
            if not any(_distribution(ep) == OWN_DISTRIBUTION for ep in found):
                raise ParityError(
                    f"parity's built-in {self.kind}s are not registered (no '{self.group}' entry points from an "
                    "installed parity): parity registers them through its installed metadata, which is missing or "
                    "older than this source; run `pip install -e .` in parity's folder")
            self._entry_points = {ep.name: ep for ep in found}
        return self._entry_points

    def names(self) -> list[str]:
        return sorted(self._scan())

    def get(self, name: str) -> T:
        if name in self._loaded:
            return self._loaded[name]
        found = self._scan()
        if name in found:
            origin = f"entry point '{name} = {found[name].value}' in '{self.group}'"
            try:
                obj = found[name].load()
            except ImportError as exc:  # a plugin whose package or a library it needs is not installed here
                raise ParityError(f"cannot load {self.kind} '{name}' (entry point in '{self.group}'): {exc}") from exc
        elif ":" in name:
            origin = "imported by reference"
            obj = import_object(name, self.kind)
        else:
            known = ", ".join(self.names())
            raise ParityError(f"unknown {self.kind} '{name}'{did_you_mean(name, self.names())} (known: {known})")
        self._loaded[name] = self._checked(name, obj, origin)
        return obj

    def _checked(self, name: str, obj, origin: str) -> T:
        """`obj` when it is what this registry holds; else a ParityError naming `name` and where it came from."""
        base = import_object(self.base, f"{self.kind} base class")
        if self.classes and isinstance(obj, type) and issubclass(obj, base):
            return obj
        if not self.classes and isinstance(obj, base):
            return obj
        named = self.base.replace(":", ".")
        wanted = f"a subclass of {named}" if self.classes else f"an instance of {named}"
        raise ParityError(f"{self.kind} '{name}' ({origin}) is {clip(repr(obj))}, not {wanted}")


def _distribution(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else None
