"""Saved tensors as an input set (`tensors: FILE`), as Polygraphy's `--load-inputs` takes them: the inputs a
user already has, handed to the model exactly as saved.

    .npy          one array: the one positional input
    .npz          arrays named arr_0, arr_1, ... (np.savez(f, a, b)): positional, in that order; other names
                  (np.savez(f, x=a)): keyword inputs
    .safetensors  named tensors: keyword inputs
    .pt / .pth    torch.save of a tensor, a list or tuple of tensors (positional) or a dict of them (keyword),
                  read with weights_only=True: a pickle that would run code is refused, never run

Only tensors of the dtypes parity compares (floating, integer, bool) are taken; `describe` says what a file
holds (name, dtype, shape) so that validation can check it against a model that declares its inputs.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from parity.config.schema import MAX_ELEMENTS
from parity.files import file_problem
from parity.inputs.base import Inputs

SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".pth")
MAX_BYTES = MAX_ELEMENTS * 8 + 2**20  # the most elements of the widest dtype, and the file's own headers
_POSITIONAL = re.compile(r"^arr_(\d+)$")
INTEGRAL = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


class TensorFileError(ValueError):
    """What is wrong with a tensors file, in one line (without the path: the caller names it)."""


def _numpy(array) -> torch.Tensor:
    if array.dtype.kind not in "fiub" or array.dtype.hasobject:
        raise TensorFileError(f"holds an array of dtype {array.dtype}; parity takes numbers and booleans")
    return torch.from_numpy(array.copy())


def _read(path: Path) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    suffix = path.suffix.lower()
    if suffix == ".npy":
        import numpy as np

        return [_numpy(np.load(path, allow_pickle=False))], {}
    if suffix == ".npz":
        import numpy as np

        with np.load(path, allow_pickle=False) as arrays:
            found = {name: _numpy(arrays[name]) for name in arrays.files}
        if found and all(_POSITIONAL.match(n) for n in found):
            return [found[n] for n in sorted(found, key=lambda n: int(_POSITIONAL.match(n).group(1)))], {}
        return [], found
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        return [], load_file(str(path))
    if suffix in (".pt", ".pth"):
        with warnings.catch_warnings():  # torch's notes on the pickle's protocol: the verdict below says what matters
            warnings.simplefilter("ignore")
            value = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(value, torch.Tensor):
            return [value], {}
        if isinstance(value, list | tuple) and all(isinstance(v, torch.Tensor) for v in value):
            return list(value), {}
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()):
            return [], dict(value)
        raise TensorFileError(f"holds a {type(value).__name__}; expected a tensor, a list or tuple of tensors, or a "
                              "dict of named tensors")
    raise TensorFileError(f"expected a {', '.join(SUFFIXES)} file, not '{path.suffix}'")


def read_tensors(path: Path) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The file's tensors: (positional, keyword). A TensorFileError says what is wrong, in one line. Only a
    regular file of a bounded size is opened: a FIFO would block validation, a huge file fill the memory."""
    problem = file_problem(path, "it")
    if problem:
        raise TensorFileError(problem.removeprefix(f"it {path}: ").replace(f"it not found: {path}", "no such file"))
    if path.stat().st_size > MAX_BYTES:
        raise TensorFileError(f"{path.stat().st_size} bytes, more than an input set of {MAX_ELEMENTS} elements holds")
    try:
        args, kwargs = _read(path)
    except TensorFileError:
        raise
    except FileNotFoundError as exc:
        raise TensorFileError("no such file") from exc
    except Exception as exc:  # a truncated, foreign or code-running file: said, never run
        raise TensorFileError(f"cannot be read as {path.suffix.lower()} tensors: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from exc
    tensors = [*args, *kwargs.values()]
    if not tensors:
        raise TensorFileError("holds no tensor")
    if sum(t.numel() for t in tensors) > MAX_ELEMENTS:
        raise TensorFileError(f"holds more than {MAX_ELEMENTS} elements, more than parity builds per input set")
    for t in tensors:
        if t.is_complex() or not (t.is_floating_point() or t.dtype in INTEGRAL):
            raise TensorFileError(f"holds a {str(t.dtype).removeprefix('torch.')} tensor; parity takes numbers and "
                                  "booleans")
    return args, kwargs


def describe(path: Path) -> list[tuple[str | None, str, list[int]]]:
    """(name or None for a positional input, dtype, shape) of each tensor the file holds, in call order."""
    args, kwargs = read_tensors(path)
    return [(None, str(t.dtype).removeprefix("torch."), list(t.shape)) for t in args] + [
        (name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in kwargs.items()]


def tensors_problem(path: Path) -> str | None:
    """Why `path` is no tensors file parity can take (None when it is), for validation."""
    try:
        read_tensors(path)
    except TensorFileError as exc:
        return f"{path}: {exc}"
    return None


def load_tensors(path: Path) -> Inputs:
    """The input set's Inputs: the file's tensors, positional and keyword, as saved."""
    args, kwargs = read_tensors(path)
    return Inputs(tuple(args), kwargs)
