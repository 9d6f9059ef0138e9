"""A target in one word: the grammar that `parity check --target`, `assert_backends_agree(targets=[...])`
and `@pytest.mark.parity(targets=[...])` share, so that what a table prints can be typed back.

    TARGET  := BACKEND [SEP DEVICE] [SEP DTYPE] [SEP QUANT]    SEP is "-" or ":"
    BACKEND := a backend name (`parity backends` lists them) | package.module:Class
    DEVICE  := cpu | cuda | cudaN                      default cpu
    DTYPE   := float32 | float64 | bfloat16 | float16  default float32; also bf16, fp16, half, fp32, fp64, double
    QUANT   := int8-pt2e-x86 | int8-pt2e-xnnpack | int8-dynamic | int8-weight | int4-weight   (the word of
               `quantize:`'s scheme, parity.dtypes.QUANTIZE_SCHEMES); a word that starts one scheme's only
               among those the backend runs (`eager-int4`, `int8-pt2e-x`) is that scheme, one that starts several
               (`eager-int8`) is refused with them

The ids of the tables (`compile-cpu`, `eager-cpu-bfloat16`, `eager-cuda`, `eager-cuda1`,
`compile-cpu-int8-pt2e-x86`) are targets, and
so are the short forms `onnxruntime`, `eager:bfloat16`, `eager-bf16` and `eager-int4`. A `package.module:Class`
backend takes no device or dtype here (give a mapping for those). Every front end reads a target the user
types through this module: `parity check --target` and the Python API parse it into an entry, `parity run
--target`, `parity localize` and `parity fallback` find the experiment's target it names (`choose`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from parity.backends import backend_class
from parity.dtypes import DTYPES, QUANTIZE_SCHEMES
from parity.errors import ParityError, did_you_mean
from parity.plugins import BACKENDS

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32", "fp64": "float64", "double": "float64"}
_DEVICE = re.compile(r"^(cpu|cuda)(\d*)$")
_CLASS_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
QUANT_WORDS = tuple(s.word for s in QUANTIZE_SCHEMES.values())
GRAMMAR = ("BACKEND[-DEVICE][-DTYPE][-QUANT], e.g. compile-cpu, eager-cpu-bfloat16, eager:bfloat16, onnxruntime, "
           f"eager-int8-weight (QUANT: {' | '.join(QUANT_WORDS)}; `parity backends` lists who runs each)")


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


@dataclass(frozen=True)
class TargetWords:
    """What a target's text says: its backend, and the device, dtype and quantize scheme it names (None: the
    text does not say, and the schema's default applies)."""

    backend: str
    device: str | None = None
    dtype: str | None = None
    scheme: str | None = None

    def entry(self, calibration: str | None = None) -> dict[str, Any]:
        """The backend entry, as an experiment file writes it: only the keys the text gives (quantize first, as
        the id's suffix is read first); `calibration` the input set a calibrated scheme is calibrated on."""
        entry: dict[str, Any] = {"backend": self.backend}
        if self.scheme is not None:
            entry["quantize"] = {"scheme": self.scheme, **({"calibration": calibration} if calibration else {})}
        if self.device is not None:
            entry["device"] = self.device
        if self.dtype is not None:
            entry["dtype"] = self.dtype
        return entry

    def names(self, target: Any) -> bool:
        """Whether the experiment's target (a BackendSpec) is the one this text names, defaults and all."""
        return (target.backend == self.backend and target.device == (self.device or "cpu")
                and target.dtype == (self.dtype or "float32")
                and (target.quantize.scheme if target.quantize else None) == self.scheme)


def parse_target(text: str) -> TargetWords:
    """What `text` names, as the grammar above reads it."""
    text = text.strip()
    names = BACKENDS.names()
    backend = _known_backend(text, names)
    if backend is None:
        if _CLASS_REF.match(text) and not _qualifier(text.rpartition(":")[2]):
            return TargetWords(text)
        head = re.split(r"[-:]", text, maxsplit=1)[0]
        if re.fullmatch(r"u?int\d+", head):  # a scheme alone (`int8`): which backend runs it is the user's to say
            ids = ", ".join(f"{n}-{s.word}" for n in ("eager", "compile") for s in QUANTIZE_SCHEMES.values()
                            if s.name in _runs(n))
            raise ParityError(f"unknown target '{text}': a quantized target names its backend first: {ids} "
                              "(`parity backends` lists every backend's schemes)")
        hint = did_you_mean(head, names) or did_you_mean(text, _ids(names))
        raise ParityError(f"unknown target '{text}': no backend '{head}'{hint} (a target is {GRAMMAR}; "
                          f"backends: {', '.join(names)})")
    rest = text[len(backend) + 1:]
    tokens = re.split(r"[-:]", rest) if rest else []
    quant = next((i for i, t in enumerate(tokens) if re.fullmatch(r"u?int\d+", t)), None)
    scheme = device = dtype = None
    if quant is not None:  # the id's quantize suffix, `-int8-weight`: `quantize: {scheme: ...}`
        scheme = _scheme(text, backend, "-".join(tokens[quant:]))
        tokens = tokens[:quant]
    for token in tokens:
        if _device(token) is not None and device is None and dtype is None:
            device = _device(token)
        elif _dtype(token) is not None and dtype is None:
            dtype = _dtype(token)
        else:
            raise ParityError(f"unknown target '{text}': {_misplaced(token, device is not None)} (a target is {GRAMMAR})")
    return TargetWords(backend, device, dtype, scheme)


def _scheme(text: str, backend: str, word: str) -> str:
    """The quantize scheme whose id word is `word`, or the only one it starts; else a one-line refusal that
    lists the ids this backend runs (`parity backends` lists every backend's)."""
    fits = [s for s in QUANTIZE_SCHEMES.values() if s.word == word] or \
        [s for s in QUANTIZE_SCHEMES.values() if s.word.startswith(word)]
    runs = _runs(backend)
    if len(fits) > 1:  # a short form (`eager-int4`): among the schemes this backend runs
        fits = [s for s in fits if s.name in runs] or fits
    if len(fits) == 1:
        return fits[0].name
    ids = ", ".join(f"{backend}-{s.word}" for s in QUANTIZE_SCHEMES.values() if s.name in runs)
    which = "is several quantize schemes" if fits else "is no quantize scheme"
    runs_what = f"{backend} runs {ids}" if ids else f"{backend} quantizes nothing (`parity backends` says who does)"
    raise ParityError(f"unknown target '{text}': '{word}' {which}; {runs_what}")


def _runs(backend: str) -> tuple[str, ...]:
    """The quantize schemes `backend` runs (none when its class cannot be loaded here)."""
    try:
        return backend_class(backend).schemes_run()
    except ParityError:
        return ()


def choose(text: str, targets: list[Any], option: str = "--target") -> Any:
    """The target (a BackendSpec of the experiment's `targets`) that `text` names: its id (or name), else the
    entry the grammar reads from `text` (`onnxruntime` for `onnxruntime-cpu`, `eager:bf16`), so that every
    command takes what `parity check --target` takes. A text that names none is one line with the ids."""
    by_id = {t.id: t for t in targets}
    if text in by_id:
        return by_id[text]
    try:
        words = parse_target(text)
    except ParityError:
        words = None
    if words is not None:
        fits = [t for t in targets if words.names(t)]
        if len(fits) == 1:
            return fits[0]
        if fits:
            raise ParityError(f"{option} {text}: several targets of the experiment are that; name one: "
                              f"{', '.join(t.id for t in fits)}")
    raise ParityError(f"{option} {text}: the experiment has no such target{did_you_mean(text, list(by_id))} "
                      f"(it has: {', '.join(by_id)})")


def _misplaced(token: str, has_device: bool) -> str:
    if _device(token) is not None:
        return f"a second device '{token}'" if has_device else f"the device '{token}' comes before the dtype"
    if _dtype(token) is not None:
        return f"a second dtype '{token}'"
    return f"no device, dtype or quantize scheme '{token}'{did_you_mean(token, ['cpu', 'cuda', *DTYPES, *DTYPE_ALIASES])}"


def _ids(names: list[str]) -> list[str]:
    """Every id the built-in grammar can spell for `names` on cpu and cuda: the did-you-mean candidates."""
    return [f"{n}-{d}" + ("" if t == "float32" else f"-{t}") for n in names for d in ("cpu", "cuda") for t in DTYPES]
