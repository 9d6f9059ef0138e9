"""A GGUF file's header, read and checked by parity before any library opens the file.

A GGUF file is data that a user hands over, and the libraries that read it trust its header: llama.cpp ends the
whole process (GGML_ASSERT, abort) on some malformed files, and a reader that allocates what a count claims runs
out of memory on a count near 2^63. `read_header` walks the header with bounded reads and checks every number
against the file's own size before it is used: the magic, the version (2 and 3: version 1's 32-bit counts are
long gone), the tensor and key-value counts, every string and array length, the value and tensor types, the
dimensions, the alignment, every tensor's data inside the file and after the header, no name twice, no token
twice in the vocabulary. A FIFO, a device or a socket is refused by name before it is opened. What it claims is
never allocated: a length is compared with the bytes left before those bytes are read.

Nothing here executes anything the file holds: a tokenizer's chat template is a string parity never renders.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.errors import ParityError, clip
from parity.files import file_problem

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 2  # an array of arrays at most (none in llama.cpp's own files)

# Value types: struct format of a scalar (8: string, 9: array are read apart).
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")
MIN_VALUE_SIZE = {**{t: struct.calcsize(f) for t, f in SCALARS.items()}, STRING: 8, ARRAY: 12}

# ggml tensor types: (name, elements per block, bytes per block), as ggml.c's type traits have them. Q8_1, an
# intermediate of ggml's dot products that no file holds (and whose size gguf-py and ggml disagree on), is not one.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
# The key-value pairs a header holds as values for parity to read (the rest are skipped, bounded all the same).
KEPT = ("general.architecture", "general.alignment", "general.file_type", "general.name", "tokenizer.ggml.model")
TOKENS = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # as GGUF lists it: the innermost (contiguous) dimension first
    type: str
    offset: int  # from the start of the file
    nbytes: int


@dataclass
class Header:
    """What `read_header` found: the version, the values parity reads (KEPT), the keys, the tensors."""

    path: Path
    version: int
    values: dict[str, Any] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    tensors: list[TensorInfo] = field(default_factory=list)
    vocabulary: int = 0  # how many tokens tokenizer.ggml.tokens lists

    @property
    def architecture(self) -> str | None:
        return self.values.get("general.architecture")


class GgufError(ParityError):
    """A GGUF file parity refuses: one line naming the file and what is wrong, exit 2."""


class _Reader:
    """Bounded reads from a file mapped read-only (nothing is read that is not parsed): every length is checked
    against the bytes left before it is read."""

    def __init__(self, data, size: int, path: Path):
        self.data, self.size, self.path, self.at = data, size, path, 0

    @property
    def left(self) -> int:
        return self.size - self.at

    def tell(self) -> int:
        return self.at

    def fail(self, message: str) -> GgufError:
        return GgufError(f"GGUF file {self.path}: {message}")

    def take(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.at}, {self.left} left")
        self.at += n
        return self.data[self.at - n:self.at]

    def skip(self, n: int) -> None:
        self.at += n  # n was checked against what is left

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        if size > self.left:
            raise self.fail(f"truncated: {what} needs {size} bytes at offset {self.at}, {self.left} left")
        self.at += size
        return struct.unpack_from(fmt, self.data, self.at - size)[0]

    def count(self, what: str, each: int) -> int:
        """A uint64 count of items of at least `each` bytes, which the rest of the file must be able to hold."""
        n = self.scalar("<Q", what)
        if n * each > self.left:
            raise self.fail(f"{what} is {n}, more than the {self.left} bytes left in the file can hold")
        return n

    def string(self, what: str) -> bytes:
        return self.take(self.count(f"length of {what}", 1), what)

    def strings(self, n: int, what: str, distinct: bool = False) -> None:
        """Past `n` strings (a vocabulary: tens of thousands, in one tight loop), each length checked against the
        bytes left; `distinct`: refuse a string listed twice."""
        data, at, size, seen = self.data, self.at, self.size, set()
        for i in range(n):
            if size - at < 8 or _U64.unpack_from(data, at)[0] > size - at - 8:
                self.at = at
                self.count(f"length of {what}[{i}]", 1)  # says which, as every other length
            length = _U64.unpack_from(data, at)[0]
            at += 8 + length
            if distinct:
                seen.add(data[at - length:at])
                if len(seen) <= i:
                    raise self.fail(f"{what}: token {i} {clip(repr(data[at - length:at]))} is listed twice")
        self.at = at

    def text(self, what: str) -> str:
        raw = self.string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8 text ({clip(repr(raw))})") from exc

    def value(self, kind: int, what: str, keep: bool, depth: int = 0):
        if kind in SCALARS:
            return self.scalar(SCALARS[kind], what)
        if kind == STRING:
            raw = self.string(what)
            return raw.decode("utf-8", "replace") if keep else None
        if kind == ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
            inner = self.scalar("<I", f"element type of {what}")
            if inner not in MIN_VALUE_SIZE:
                raise self.fail(f"{what}: unknown element type {inner}")
            n = self.count(f"element count of {what}", MIN_VALUE_SIZE[inner])
            if inner in SCALARS and not keep:  # fixed-size elements: skipped in one step
                self.skip(n * MIN_VALUE_SIZE[inner])
                return None
            if inner == STRING and not keep:  # a vocabulary's merges: each length checked, nothing decoded
                self.strings(n, what)
                return None
            return [self.value(inner, f"{what}[{i}]", keep, depth + 1) for i in range(n)]
        raise self.fail(f"{what}: unknown value type {kind}")


def special_problem(path: Path) -> str | None:
    """Why `path` cannot be opened as a GGUF file (not there, a FIFO, a device, a socket, a folder), or None."""
    return file_problem(path, "GGUF file")


def read_header(path: Path) -> Header:
    """The checked header of the GGUF file at `path`, or a GgufError (one line) saying what is wrong with it."""
    problem = special_problem(path)
    if problem:
        raise GgufError(problem)
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; the stat is of the opened file, not of the name)
    except OSError as exc:
        raise GgufError(f"GGUF file {path}: cannot be read ({exc.strerror or exc})") from exc
    with f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # replaced by something else between the check and the open
            raise GgufError(f"GGUF file {path}: not a regular file")
        if st.st_size < len(MAGIC):
            return _parse(_Reader(b"", 0, path))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Reader(data, st.st_size, path))


def _parse(r: _Reader) -> Header:
    magic = bytes(r.data[:len(MAGIC)])
    if magic != MAGIC:
        raise r.fail(f"not a GGUF file (starts with {clip(repr(magic))}, not b'GGUF')")
    r.skip(len(MAGIC))
    version = r.scalar("<I", "the version")
    if version not in VERSIONS:
        raise r.fail(f"GGUF version {version}: parity reads versions {' and '.join(map(str, VERSIONS))}")
    header = Header(r.path, version)
    # The least a tensor info takes: a name length (8), n_dims (4), one dimension (8), a type (4), an offset (8);
    # a key-value pair: a key length (8), a one-byte key, a value type (4), a one-byte value.
    n_tensors = r.count("the tensor count", 32)
    n_values = r.count("the key-value count", 14)
    seen: set[str] = set()
    for i in range(n_values):
        key = r.text(f"key {i}")
        if key in seen:
            raise r.fail(f"key {clip(key)!r} appears twice")
        seen.add(key)
        kind = r.scalar("<I", f"the type of {clip(key)}")
        if key == TOKENS:
            header.vocabulary = _vocabulary(r, kind)
            continue
        value = r.value(kind, clip(key), keep=key in KEPT)
        if key in KEPT:
            header.values[key] = value
    header.keys = list(seen)
    alignment = header.values.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1 or alignment & (alignment - 1) \
            or alignment > 1 << 20:
        raise r.fail(f"general.alignment {clip(repr(alignment))} is not a power of two up to 2^20")
    infos = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = r.text(f"the name of tensor {i}")
        if name in names:
            raise r.fail(f"tensor {clip(name)!r} appears twice")
        names.add(name)
        n_dims = r.scalar("<I", f"the dimension count of {clip(name)}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"tensor {clip(name)!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
        shape = tuple(r.scalar("<Q", f"a dimension of {clip(name)}") for _ in range(n_dims))
        kind = r.scalar("<I", f"the type of {clip(name)}")
        if kind not in GGML_TYPES:
            raise r.fail(f"tensor {clip(name)!r} has unknown ggml type {kind}")
        offset = r.scalar("<Q", f"the offset of {clip(name)}")
        infos.append((name, shape, kind, offset))
    start = -(-r.tell() // alignment) * alignment  # the data section starts at the next aligned offset
    for name, shape, kind, offset in infos:
        type_name, block, block_bytes = GGML_TYPES[kind]
        elements = 1
        for d in shape:
            if d < 1:
                raise r.fail(f"tensor {clip(name)!r} has an empty dimension ({list(shape)})")
            elements *= d
            if elements > r.size * 8:  # no type packs more than 8 elements in a byte: bounded before it grows
                raise r.fail(f"tensor {clip(name)!r} of shape {list(shape)} is larger than the whole file")
        if shape[0] % block:
            raise r.fail(f"tensor {clip(name)!r}: its first dimension {shape[0]} is not a multiple of {type_name}'s "
                         f"block of {block}")
        nbytes = elements // block * block_bytes
        if offset % alignment:
            raise r.fail(f"tensor {clip(name)!r}: offset {offset} is not a multiple of the alignment {alignment}")
        if start + offset + nbytes > r.size:
            raise r.fail(f"tensor {clip(name)!r}: its data ({nbytes} bytes at offset {start + offset}) ends past the "
                         f"end of the file ({r.size} bytes)")
        header.tensors.append(TensorInfo(name, shape, type_name, start + offset, nbytes))
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in header.tensors)
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise r.fail(f"tensors {clip(first)!r} and {clip(second)!r} overlap")
    return header


def _vocabulary(r: _Reader, kind: int) -> int:
    """How many tokens tokenizer.ggml.tokens lists (an array of strings), each read once to refuse a token listed
    twice: llama.cpp aborts the whole process on a vocabulary with a duplicated entry."""
    if kind != ARRAY or r.scalar("<I", f"the element type of {TOKENS}") != STRING:
        raise r.fail(f"{TOKENS} is not an array of strings")
    n = r.count(f"the element count of {TOKENS}", 8)
    r.strings(n, TOKENS, distinct=True)
    return n


def describe(header: Header) -> str:
    """One line: the architecture, its tensors and their types, the vocabulary."""
    types: dict[str, int] = {}
    for t in header.tensors:
        types[t.type] = types.get(t.type, 0) + 1
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(types.items(), key=lambda kv: -kv[1]))
    return (f"GGUF v{header.version} {header.architecture or 'unknown architecture'}: {len(header.tensors)} tensors "
            f"({kinds}), {header.vocabulary} tokens")


def gguf_problem(path: Path) -> str | None:
    """Why `path` is not a GGUF file parity reads (what it is, its suffix, its header: this module), or None."""
    problem = special_problem(path)
    if problem:
        return problem
    if path.suffix.lower() != ".gguf":
        return f"GGUF file {path}: expected a .gguf file, not '{path.suffix or path.name}'"
    try:
        read_header(path)
    except ParityError as exc:
        return exc.problems[0]
    return None
