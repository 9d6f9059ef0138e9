"""Fingerprints of the code that decides a result: the user's model code, parity's own source, and the
versions of the libraries involved. The artifact cache keys on them (execute/cache.py): an export made
from other code must never be taken for this code's.

Code is sorted by where it lives:
- parity's own: its source files, hashed whole once per process (its version string does not change
  between commits);
- an installed library (site-packages, the standard library): the version of its distribution;
- user code (anywhere else: a repository folder, a test file, a notebook cell, a class made at run
  time): the bytes of its file when it has one, *and* its code objects (bytecode, constants, names,
  recursively). So code whose source cannot be read is still told apart, and a module edited on disk
  after it was imported is keyed on the code that runs, not only on what the file says now.
From a user class the walk takes its methods and attributes and the other classes of its MRO; from a
user function, its defaults, closure and the globals its code names (functions, classes, constants by
value, modules and the attributes it reads of them). It stops at library and parity code. It is
bounded (MAX_OBJECTS, MAX_FILES, MAX_BYTES); past a bound there is no fingerprint, and nothing is cached.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib.metadata
import os
import site
import sys
import sysconfig
import types
from collections import OrderedDict, deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from parity.files import is_regular

MAX_OBJECTS = 5000  # user classes, functions and modules one walk may visit
MAX_FILES = 1000  # user source files one fingerprint may read (a repository folder's .py files, too)
MAX_BYTES = 64 * 2**20  # and their size in all
MAX_DEPTH = 4  # how deep into containers and plain objects a value is described

PARITY, LIBRARY, USER = "parity", "library", "user"
# Module attributes that are covered otherwise (parameters and buffers by the state dict, submodules by
# their own walk) or that describe nothing the module computes.
_COVERED = frozenset({"_parameters", "_buffers", "_modules"})
# Values hashed by their repr, which says all of them; checked by exact type first (most values are).
_PLAIN_KINDS = (type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device, torch.Size,
                types.EllipsisType)
_PLAIN = frozenset(_PLAIN_KINDS)
_CONTAINERS = frozenset({list, tuple, dict, OrderedDict, set, frozenset})


class TooLarge(Exception):
    """The code to fingerprint is past a bound."""


# -- where code lives -------------------------------------------------------------------------------

@functools.cache
def _install_roots() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= set(site.getsitepackages()) | {site.getusersitepackages()}
    return tuple(sorted(os.path.join(os.path.realpath(p), "") for p in paths if p))


@functools.cache
def _parity_root() -> str:
    return os.path.join(os.path.realpath(Path(__file__).parent), "")


@functools.lru_cache(maxsize=4096)
def _file_kind(path: str) -> str | None:
    """PARITY, LIBRARY or USER for a source file that exists, else None."""
    if not os.path.isfile(path):
        return None
    real = os.path.realpath(path)
    if real.startswith(_parity_root()):
        return PARITY
    return LIBRARY if real.startswith(_install_roots()) else USER


def kind_of(module: str | None, file: str | None) -> str:
    """Where code of `module`, read from `file`, lives. Code from no file on disk is user code (a notebook
    cell, a string given to exec, whatever module it says it is in), except the standard library's frozen
    modules; with no file at all (built-in, compiled), the module decides."""
    found = _file_kind(file) if file else None
    if found is not None:
        return found
    if file and not file.startswith("<frozen "):
        return USER
    top = (module or "").partition(".")[0]
    return LIBRARY if top in sys.stdlib_module_names or top in sys.builtin_module_names else USER


def _class_files(cls: type) -> list[str]:
    """The files a class may come from: its module's (when still imported) and its own functions' (which
    say it even when the module was imported from a repository folder and has left sys.modules since)."""
    files = [getattr(sys.modules.get(cls.__module__), "__file__", None)]
    for attr in vars(cls).values():
        code = getattr(getattr(attr, "__func__", attr), "__code__", None)
        if isinstance(code, types.CodeType):
            files.append(code.co_filename)
    return sorted({f for f in files if f})


def _class_kind(cls: type) -> str:
    """A class is a library's (or parity's) only when everything about it says so: a class in a notebook
    cell has the kernel's launcher for `__main__.__file__`, but its methods' code says where it was typed."""
    kinds = {kind_of(cls.__module__, f) for f in _class_files(cls)} or {kind_of(cls.__module__, None)}
    return USER if USER in kinds else PARITY if PARITY in kinds else LIBRARY


# -- libraries ---------------------------------------------------------------------------------------

@functools.cache
def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _record_digest(distribution: str) -> str | None:
    """The digest of a distribution's RECORD, the list of its files with the hash of each: a package
    reinstalled with other code under the same version (a team's own, built again) still differs."""
    try:
        record = importlib.metadata.distribution(distribution).read_text("RECORD")
    except importlib.metadata.PackageNotFoundError:
        return None
    return hashlib.sha256(record.encode()).hexdigest()[:16] if record else None


def versions(distributions: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
    """Each distribution's installed version (None: not installed) and the digest of its file list, by name."""
    return {name: (version(name), _record_digest(name)) for name in sorted(set(distributions))}


@functools.cache
def distributions_of(module: str) -> tuple[str, ...]:
    """The distributions that install the top-level package of `module` (none for the standard library).
    Most are named as they import (torch, timm, transformers); the others (PIL, cv2) are looked up in the
    full table, which costs most of a second the first time."""
    top = module.partition(".")[0]
    if not top or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return ()
    if version(top) is not None:
        return (top,)
    return tuple(sorted(_package_table().get(top, [top])))


@functools.cache
def _package_table() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


# -- files -------------------------------------------------------------------------------------------

@functools.cache
def parity_digest() -> str:
    """parity's own source files (once per process)."""
    root = Path(_parity_root())
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def folder_digest(folder: Path) -> str | None:
    """A repository folder's Python files: every `*.py` below it, outside hidden folders and __pycache__,
    by relative path and content. None when there are more than MAX_FILES or MAX_BYTES of them."""
    h = hashlib.sha256()
    count = size = 0
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(here, name)
            if not is_regular(path):  # a FIFO would block the read: such a folder is never cached
                return None
            count += 1
            size += path.stat().st_size
            if count > MAX_FILES or size > MAX_BYTES:
                return None
            h.update(str(path.relative_to(folder)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def module_digest(name: str) -> str | None:
    """What the module `name` (imported already) is: its file's bytes when it is user code, its
    distributions' versions for a library, parity's digest for parity. None when it has no file to read."""
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    kind = kind_of(name, file)
    if kind == LIBRARY:
        return f"library {versions(distributions_of(name))}"
    if kind == PARITY:
        return f"parity {parity_digest()}"
    if file is None or not os.path.isfile(file):
        return None
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


# -- the walk ----------------------------------------------------------------------------------------

class CodeWalk:
    """The user code that objects run, hashed; and the distributions of the library code they reach."""

    def __init__(self):
        self._parts: list[bytes] = []  # what is hashed, in the order the walk met it
        self._files: dict[str, str] = {}
        self._bytes = 0
        self._seen: dict[int, Any] = {}  # id -> object, kept alive so that ids stay unique
        self._todo: deque = deque()
        self._classes: set[type] = set()  # every class looked at, a library's too (nn.Module has 200 methods)
        self.libraries: set[str] = set()

    # public entry points

    def model(self, model: torch.nn.Module) -> CodeWalk:
        """Every module's class and what its instance holds besides parameters, buffers and submodules
        (plain attributes a forward reads, hooks)."""
        for module in model.modules():
            self._token("module")
            self._value(type(module))
            for name, value in sorted(vars(module).items()):
                if name in _COVERED:
                    continue
                self._token(name)
                # hook tables are keyed by handle ids, which count up across the process: values only
                self._value(list(value.values()) if "hook" in name and isinstance(value, dict) else value)
        return self._drain()

    def objects(self, *objects: Any) -> CodeWalk:
        for obj in objects:
            self._value(obj)
        return self._drain()

    def digest(self) -> str:
        """The code seen, and the content of the user files it lives in (path-independent)."""
        h = hashlib.sha256(b"\0".join(self._parts))
        for file_digest in sorted(self._files.values()):
            h.update(file_digest.encode())
        return h.hexdigest()

    # the work list (no recursion through user code: a long chain of helpers cannot overflow the stack)

    def _drain(self) -> CodeWalk:
        while self._todo:
            obj = self._todo.popleft()
            if isinstance(obj, type):
                self._class(obj)
            elif isinstance(obj, types.FunctionType):
                self._function(obj)
            else:
                self._module(*obj)
        return self

    def _first_time(self, obj: Any) -> bool:
        if id(obj) in self._seen:
            return False
        if len(self._seen) >= MAX_OBJECTS:
            raise TooLarge(f"more than {MAX_OBJECTS} classes, functions and modules of user code")
        self._seen[id(obj)] = obj
        return True

    def _token(self, *parts: Any) -> None:
        self._parts.append(repr(parts).encode())

    def _file(self, path: str | None) -> None:
        if not path or path in self._files or _file_kind(path) != USER:
            return
        data = Path(path).read_bytes()
        self._bytes += len(data)
        if len(self._files) >= MAX_FILES or self._bytes > MAX_BYTES:
            raise TooLarge(f"more than {MAX_FILES} files or {MAX_BYTES} bytes of user code")
        self._files[path] = hashlib.sha256(data).hexdigest()

    def _library(self, module: str | None) -> None:
        self.libraries.update(distributions_of(module or ""))

    # what is reached

    def _value(self, value: Any, depth: int = 0) -> None:
        """A value user code refers to: code is queued for the walk, data is hashed by value."""
        if type(value) in _PLAIN or isinstance(value, _PLAIN_KINDS):
            self._parts.append(repr(value).encode())
        elif type(value) in _CONTAINERS and not value:  # a module's many hook tables, nearly always empty
            self._parts.append(type(value).__qualname__.encode())
        elif isinstance(value, torch.Tensor):
            self._tensor(value)
        elif isinstance(value, type | types.FunctionType):
            self._token("code", getattr(value, "__module__", None), getattr(value, "__qualname__", None))
            self._todo.append(value)
            if isinstance(value, types.FunctionType) and hasattr(value, "__wrapped__"):  # under a decorator
                self._value(value.__wrapped__, depth)
        elif isinstance(value, types.ModuleType):
            self._token("module", value.__name__)
            self._todo.append((value, ()))
        elif isinstance(value, types.MethodType | staticmethod | classmethod):
            self._value(value.__func__, depth)
        elif isinstance(value, property):
            self._value([value.fget, value.fset, value.fdel], depth)
        elif isinstance(value, functools.partial):
            self._value([value.func, value.args, value.keywords], depth)
        elif isinstance(value, types.BuiltinFunctionType | types.BuiltinMethodType):
            self._token("builtin", getattr(value, "__module__", None), value.__qualname__)
            self._library(getattr(value, "__module__", None) or type(getattr(value, "__self__", None)).__module__)
        elif depth >= MAX_DEPTH:
            self._token("deep", type(value).__qualname__)
        elif isinstance(value, list | tuple):
            self._token(type(value).__qualname__, len(value))
            for item in value:
                self._value(item, depth + 1)
        elif isinstance(value, dict):
            self._token("dict", len(value))
            for key in sorted(value, key=repr):
                self._value(key, depth + 1)
                self._value(value[key], depth + 1)
        elif isinstance(value, set | frozenset):
            self._token("set", sorted(map(repr, value)))
        else:  # an instance: its class, and what it holds (never its repr, which may hold an address)
            self._value(type(value))
            if hasattr(value, "__dict__") and self._first_time(value):
                self._value(dict(vars(value)), depth + 1)

    def _tensor(self, t: torch.Tensor) -> None:
        t = t.detach().to("cpu")
        self._token("tensor", str(t.dtype), tuple(t.shape), str(t.layout))
        if t.layout == torch.strided and not t.is_quantized and t.numel():
            self._parts.append(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())

    def _class(self, cls: type) -> None:
        for k in cls.__mro__:
            if k in self._classes:
                continue
            self._classes.add(k)
            kind = _class_kind(k)
            if kind == LIBRARY:
                self._library(k.__module__)
            elif kind == USER and self._first_time(k):
                self._token("class", k.__module__, k.__qualname__, [b.__qualname__ for b in k.__bases__])
                for file in _class_files(k):
                    self._file(file)
                for name, attr in sorted(vars(k).items()):
                    # an empty `__annotations__` is what Python puts in a class's dict the first time anything
                    # reads it (a runtime-checkable Protocol's isinstance does): not code, and not there before
                    if name not in ("__dict__", "__weakref__") and not (name == "__annotations__" and attr == {}):
                        self._token(name)
                        self._value(attr)

    def _function(self, fn: types.FunctionType) -> None:
        code = fn.__code__
        kind = kind_of(fn.__module__, code.co_filename)
        if kind == LIBRARY:
            self._library(fn.__module__)
            return
        if kind == PARITY or not self._first_time(fn):
            return
        self._file(code.co_filename)
        self._code(code, fn.__globals__)
        self._value([fn.__defaults__, fn.__kwdefaults__])
        for cell in fn.__closure__ or ():
            try:
                self._value(cell.cell_contents)
            except ValueError:  # a cell not filled yet
                self._token("empty cell")

    def _code(self, code: types.CodeType, globals_: dict[str, Any]) -> None:
        """The code itself (not its file name or line numbers), and the globals it names."""
        self._token(code.co_name, code.co_argcount, code.co_kwonlyargcount, code.co_flags, code.co_names,
                    code.co_varnames, code.co_freevars, code.co_cellvars)
        self._parts.append(code.co_code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._code(const, globals_)
            else:
                self._value(const)
        for name in code.co_names:
            if name in globals_:
                value = globals_[name]
                self._token("global", name)
                if isinstance(value, types.ModuleType):  # and the attributes this code may read of it
                    self._token("module", value.__name__)
                    self._todo.append((value, code.co_names))
                else:
                    self._value(value)

    def _module(self, module: types.ModuleType, names: tuple[str, ...]) -> None:
        file = getattr(module, "__file__", None)
        kind = kind_of(module.__name__, file)
        if kind == LIBRARY:
            self._library(module.__name__)
        elif kind == USER:
            self._file(file)
            contents = vars(module)
            for name in names:
                if name in contents and not isinstance(contents[name], types.ModuleType):
                    self._token("attribute", module.__name__, name)
                    self._value(contents[name])


def code_fingerprint(model: torch.nn.Module | None, *objects: Any) -> tuple[str, set[str]] | None:
    """The digest of the user code that `model` (None: no model) and `objects` (such as a backend class) run,
    and the distributions of the library code it reaches; None when that code is past the walk's bounds or
    could not be walked (then nothing may be cached for it)."""
    try:
        walk = CodeWalk()
        if model is not None:
            walk.model(model)
        walk.objects(*objects)
    except Exception:  # TooLarge, or an object the walk cannot read: exported afresh, never guessed at
        return None
    return walk.digest(), walk.libraries
