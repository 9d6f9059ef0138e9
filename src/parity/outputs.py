"""Flatten any model output into named leaves, so that every output is compared.

Tuples and lists give `[i]`, mappings (dicts, OrderedDicts, Hugging Face ModelOutput) give `['key']`,
namedtuples and dataclasses give `.field`: a detection model's list of dicts becomes `out[0]['boxes']`. A
key-value cache (transformers' `DynamicCache`: `.layers`, each with `.keys` and `.values` tensors) gives
`.layers[i].keys` and `.layers[i].values`; an encoder-decoder's (`EncoderDecoderCache`) gives
`.self_attention_cache.layers[i].keys`, ... and `.cross_attention_cache.layers[i].keys`, ....
Tensors, numpy arrays, numbers, strings, booleans and None are leaves; anything else is an *opaque*
leaf that cannot be compared, which the verifier turns into a failure with its reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

ROOT = "out"
SCALARS = (bool, int, float, complex, str, bytes, type(None))


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A leaf of a type parity cannot compare; kept so that the structure is still visible."""

    type_name: str


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _is_transformers_cache(obj: Any) -> bool:
    """A `transformers.cache_utils.Cache`, found by its classes' module, so that transformers is never imported here."""
    return any(cls.__module__ == "transformers.cache_utils" and cls.__name__ == "Cache" for cls in type(obj).__mro__)


# An encoder-decoder's cache (transformers' `EncoderDecoderCache`, T5's): two caches, compared each by its layers.
ENCODER_DECODER_CACHES = ("self_attention_cache", "cross_attention_cache")


def _is_encoder_decoder_cache(obj: Any) -> bool:
    return _is_transformers_cache(obj) and all(_is_cache(getattr(obj, part, None)) for part in ENCODER_DECODER_CACHES)


def _is_cache(obj: Any) -> bool:
    """A transformers key-value cache whose layers hold keys and values: compared by them. Another object
    with a `layers` list is no cache: its other fields would go uncompared, so it stays opaque."""
    if not _is_transformers_cache(obj):
        return False
    layers = getattr(obj, "layers", None)
    return isinstance(layers, list) and all(isinstance(getattr(layer, "keys", None), torch.Tensor)
                                            and isinstance(getattr(layer, "values", None), torch.Tensor) for layer in layers)


def _children(obj: Any) -> list[tuple[str, Any]] | None:
    """(name suffix, child) pairs, or None when `obj` is a leaf."""
    if isinstance(obj, torch.Tensor | np.ndarray | np.generic) or isinstance(obj, SCALARS):
        return None
    if _is_namedtuple(obj):
        return [(f".{f}", getattr(obj, f)) for f in obj._fields]
    if isinstance(obj, Mapping):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, list | tuple):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f".{f.name}", getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    if _is_cache(obj):
        return [(f".layers[{i}].{part}", getattr(layer, part)) for i, layer in enumerate(obj.layers) for part in ("keys", "values")]
    if _is_encoder_decoder_cache(obj):
        return [(f".{part}", getattr(obj, part)) for part in ENCODER_DECODER_CACHES]
    return None


def flatten(output: Any, root: str = ROOT) -> dict[str, Any]:
    """Named leaves in a stable order: {"out[0]['boxes']": tensor, ...}. Numpy becomes torch."""
    leaves: dict[str, Any] = {}

    def walk(obj: Any, name: str) -> None:
        children = _children(obj)
        if children is None:
            if isinstance(obj, np.ndarray | np.generic):
                obj = torch.from_numpy(np.asarray(obj))
            elif not isinstance(obj, (torch.Tensor, *SCALARS)):
                obj = Opaque(type(obj).__qualname__)
            leaves[name] = obj
            return
        if not children:
            leaves[name] = type(obj)()  # an empty container is still part of the structure
        for suffix, child in children:
            walk(child, name + suffix)

    walk(output, root)
    return leaves


def float_rms(output: Any) -> float:
    """The root mean square, in float64, of the finite values of `output`'s floating-point tensor leaves; 0 when it
    has none (`config.tolerances.Tolerance.at_scale` makes a scale-aware gate of it)."""
    values = [v.detach().double().flatten() for v in flatten(output).values()
              if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    every = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    finite = every[torch.isfinite(every)]
    return float(finite.pow(2).mean().sqrt()) if finite.numel() else 0.0


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply `fn` to every tensor inside the containers `flatten` understands, keeping their types."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if _is_namedtuple(obj):
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn) for k, v in obj.items()}
        try:
            return type(obj)(items)
        except TypeError:
            return items
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init})
    return obj
