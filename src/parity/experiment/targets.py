"""A target in one word: the grammar that `parity check --target`, `assert_backends_agree(targets=[...])`
and `@pytest.mark.parity(targets=[...])` share, so that what a table prints can be typed back.

    TARGET  := BACKEND [SEP DEVICE] [SEP DTYPE]        SEP is "-" or ":"
    BACKEND := a backend name (`parity backends` lists them) | package.module:Class
    DEVICE  := cpu | cuda | cudaN                      default cpu
    DTYPE   := float32 | float64 | bfloat16 | float16  default float32; also bf16, fp16, half, fp32, fp64, double
    QUANT   := int8-pt2e-x86 | int8-pt2e-xnnpack | int8-dynamic | int8-weight | int4-weight   (last: the word of
               `quantize:`'s scheme, parity.dtypes.QUANTIZE_SCHEMES)

The ids of the tables (`compile-cpu`, `eager-cpu-bfloat16`, `eager-cuda`, `eager-cuda1`,
`compile-cpu-int8-pt2e-x86`) are targets, and
so are the short forms `onnxruntime`, `eager:bfloat16` and `eager-bf16`. A `package.module:Class` backend
takes no device or dtype here (give a mapping for those).
"""

from __future__ import annotations

import re
from typing import Any

from parity.dtypes import DTYPES, QUANTIZE_SCHEMES
from parity.errors import ParityError, did_you_mean
from parity.plugins import BACKENDS

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32", "fp64": "float64", "double": "float64"}
_DEVICE = re.compile(r"^(cpu|cuda)(\d*)$")
_CLASS_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
GRAMMAR = "BACKEND[-DEVICE][-DTYPE], e.g. compile-cpu, eager-cpu-bfloat16, eager:bfloat16, onnxruntime"


def _device(token: str) -> str | None:
    """`cpu`, `cuda`, `cuda1` (as ids print it) -> the spec's device (`cuda:1`); None when not a device."""
    match = _DEVICE.match(token)
    if not match or (match.group(1) == "cpu" and match.group(2)):
        return None
    return match.group(1) + (f":{match.group(2)}" if match.group(2) else "")


def _dtype(token: str) -> str | None:
    token = DTYPE_ALIASES.get(token, token)
    return token if token in DTYPES else None


def _qualifier(token: str) -> bool:
    return _device(token) is not None or _dtype(token) is not None


def _known_backend(text: str, names: list[str]) -> str | None:
    """The longest backend name that `text` is, or starts with followed by a separator."""
    fits = [n for n in names if text == n or (text.startswith(n) and text[len(n)] in "-:")]
    return max(fits, key=len, default=None)


def parse_target(text: str) -> dict[str, Any]:
    """The backend entry (`{"backend", "device", "dtype"}`, only the keys the text gives) that `text` names."""
    text = text.strip()
    names = BACKENDS.names()
    backend = _known_backend(text, names)
    if backend is None:
        if _CLASS_REF.match(text) and not _qualifier(text.rpartition(":")[2]):
            return {"backend": text}
        head = re.split(r"[-:]", text, maxsplit=1)[0]
        hint = did_you_mean(head, names) or did_you_mean(text, _ids(names))
        raise ParityError(f"unknown target '{text}': no backend '{head}'{hint} (a target is {GRAMMAR}; "
                          f"backends: {', '.join(names)})")
    entry: dict[str, Any] = {"backend": backend}
    rest = text[len(backend) + 1:]
    for scheme in QUANTIZE_SCHEMES.values():  # the id's int8 suffix: `quantize: {scheme: ...}`
        suffix = scheme.word
        if rest == suffix or rest.endswith(("-" + suffix, ":" + suffix)):
            entry["quantize"] = {"scheme": scheme.name}
            rest = rest[:-len(suffix)].rstrip("-:")
    tokens = re.split(r"[-:]", rest) if rest else []
    for token in tokens:
        device, dtype = _device(token), _dtype(token)
        if device is not None and "device" not in entry and "dtype" not in entry:
            entry["device"] = device
        elif dtype is not None and "dtype" not in entry:
            entry["dtype"] = dtype
        else:
            raise ParityError(f"unknown target '{text}': {_misplaced(token, entry)} (a target is {GRAMMAR})")
    return entry


def _misplaced(token: str, entry: dict[str, Any]) -> str:
    if _device(token) is not None:
        return f"a second device '{token}'" if "device" in entry else f"the device '{token}' comes before the dtype"
    if _dtype(token) is not None:
        return f"a second dtype '{token}'"
    return f"no device or dtype '{token}'{did_you_mean(token, ['cpu', 'cuda', *DTYPES, *DTYPE_ALIASES])}"


def _ids(names: list[str]) -> list[str]:
    """Every id the built-in grammar can spell for `names` on cpu and cuda: the did-you-mean candidates."""
    return [f"{n}-{d}" + ("" if t == "float32" else f"-{t}") for n in names for d in ("cpu", "cuda") for t in DTYPES]
