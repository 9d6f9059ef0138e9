"""Weights: a seeded init (the same seed gives identical weights on every run) or a local file.

A weights file is checked before it is read, by `parity run` and `parity validate` alike: it must be a
regular file (a FIFO would block, /dev/zero would never end), not empty, and a torch file's archive must
not inflate beyond `MAX_INFLATION` times its size on disk (torch.save stores tensors uncompressed; a
few MB of deflated zeros that would become GBs in memory is a zip bomb). `validate` then unpickles it as
`run` does (weights_only=True) with the tensors memory-mapped, not read, so it refuses what `run` refuses
without building a model or holding the weights.
"""

from __future__ import annotations

import contextlib
import re
import warnings
import zipfile
from pathlib import Path

import torch

from parity.errors import ParityError
from parity.files import file_problem

MAX_INFLATION = 20  # a torch file's archive may hold at most this many times its size on disk (plus SLACK)
SLACK = 1 << 20


@contextlib.contextmanager
def seeded(seed: int):
    """Seed torch's global generator for a model's construction without disturbing the caller's."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


NORM_CLASS = re.compile(r"Norm(\d[dD])?$")  # LayerNorm, RMSNorm, LlamaRMSNorm, T5LayerNorm, LayerNorm2d, BatchNorm1d


def is_norm(module: torch.nn.Module) -> bool:
    """A normalization layer, whose affine parameters are its scale by design (RMSNorm gains of ones: redrawn, a
    LLaMA's hidden states change scale block by block, which can hide a bug in what follows, e.g. RoPE). torch's
    own and any class (or base class) named like one: transformers' LlamaRMSNorm, Qwen2RMSNorm, T5LayerNorm..."""
    return any(NORM_CLASS.search(cls.__name__) for cls in type(module).__mro__ if cls is not torch.nn.Module)


def redraw_fan_in(model: torch.nn.Module, seed: int) -> None:
    """Redraw every weight from N(0, 2/fan_in) and every bias from N(0, 0.1^2); normalization layers keep
    theirs (`is_norm`). Some builders' own init collapses the outputs (a random-init MobileNet's logits are ~1e-9,
    SSDlite gives every box one score), which hides all drift; this init gives varied outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if is_norm(module):
                continue
            for param in module.parameters(recurse=False):
                if param.dim() >= 2:
                    std = (2.0 / param[0].numel()) ** 0.5
                else:
                    std = 0.1
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype) * std)


def _unpickling_reason(exc: BaseException) -> tuple[str, bool]:
    """(torch's refusal in a few words, whether the file names a callable). torch's own message is long,
    changes between versions and advises loading with weights_only=False, which would run the code."""
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split())
    called = re.search(r"GLOBAL ([\w.]+)", text)
    if called:
        return f"unpickling it would call {called.group(1)}", True
    detail = re.search(r"(WeightsUnpickler error: .*?|Unsupported operand \d+)(?: Check the documentation|$)", text)
    return (detail.group(1) if detail else text)[:200], False


def _archive_problem(path: Path) -> str | None:
    """Why a torch file's zip archive must not be opened (a bomb), or None. A file that is not a zip
    archive (torch's legacy format, or not a torch file at all) is left to torch.load to judge."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            inflated = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return f"cannot load weights from {path}: a damaged zip archive ({exc})"
    on_disk = path.stat().st_size
    if inflated > MAX_INFLATION * on_disk + SLACK:
        return (f"refusing weights file {path}: its archive inflates to {inflated / 1e6:.1f} MB from "
                f"{on_disk / 1e6:.1f} MB on disk (more than {MAX_INFLATION}x); torch.save stores tensors "
                "uncompressed, so this is not a file parity loads")
    return None


def check_weights_file(path: Path) -> None:
    """Refuse, before anything reads it, a weights path that is not a regular, non-empty file, or a
    torch archive that would inflate far beyond its size."""
    problem = file_problem(path, "weights file")
    if problem is None and path.stat().st_size == 0:
        problem = f"weights file {path}: is empty"
    if problem is None and path.suffix != ".safetensors":
        problem = _archive_problem(path)
    if problem:
        raise ParityError(problem)


def load_state_dict(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """Tensors from a `.safetensors` file or a torch file. A torch file is unpickled with
    `weights_only=True` only: a file that holds anything but tensors and plain containers (a pickled
    object whose `__reduce__` runs a command) is refused before any of its code can run. `mmap`: the
    tensors of a torch archive are mapped, not read (what `parity validate` needs to judge the file)."""
    check_weights_file(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # SafetensorError, OSError: a damaged or foreign file
            raise ParityError(f"cannot load weights from {path}: not a valid .safetensors file ({exc})") from exc
    import pickle

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols; the error says what matters
            state = torch.load(str(path), map_location="cpu", weights_only=True,
                               mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        reason, calls = _unpickling_reason(exc)
        if calls:  # the pickle names a function or class to call: code, not weights
            raise ParityError(
                f"refusing weights file {path}: it holds Python objects other than tensors, and parity loads "
                f"torch files only with weights_only=True, so that loading cannot run code ({reason}); "
                "save model.state_dict() with torch.save, or use a .safetensors file") from exc
        raise ParityError(f"cannot load weights from {path}: not a torch file that weights_only=True can read "
                          f"({reason}); save model.state_dict() with torch.save, or use a .safetensors file") from exc
    except Exception as exc:  # torch raises many kinds here; the user needs the file and the reason
        raise ParityError(f"cannot load weights from {path} (weights_only=True): {_unpickling_reason(exc)[0]}") from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ParityError(f"{path} does not hold a state dict (got {type(state).__name__})")
    return state


def weights_problem(path: Path) -> str | None:
    """What `parity validate` says of a weights file: what loading it for `parity run` would refuse."""
    try:
        if path.suffix != ".safetensors":
            load_state_dict(path, mmap=True)
            return None
        check_weights_file(path)
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:  # reads and checks the header, not the tensors
                f.keys()
        except Exception as exc:  # SafetensorError, OSError: a damaged or foreign file
            raise ParityError(f"cannot load weights from {path}: not a valid .safetensors file ({exc})") from exc
    except ParityError as exc:
        return exc.problems[0]
    return None


def apply_weights(model: torch.nn.Module, path: Path) -> None:
    state = load_state_dict(path)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        parts = []
        if result.missing_keys:
            parts.append(f"missing {len(result.missing_keys)} (e.g. {', '.join(result.missing_keys[:3])})")
        if result.unexpected_keys:
            parts.append(f"unexpected {len(result.unexpected_keys)} (e.g. {', '.join(result.unexpected_keys[:3])})")
        raise ParityError(f"weights in {path} do not fit the model: {'; '.join(parts)}")
