"""How a tensor, a module or a value feeds a hash: one home for the artifact cache's keys (execute/cache.py:
the model, its weights, the example inputs) and the Python API's reference cache (api.py). Two values that
differ must never feed the same bytes, or a cache serves one's outputs or artifact for the other: a dense
tensor feeds its bytes; a sparse or quantized one (whose bytes alone leave out its indices, or its scale
and zero point) feeds its serialized form."""

from __future__ import annotations

import io
from typing import Any

import torch


def feed_tensor(h, t: torch.Tensor) -> None:
    """Feed `t`'s dtype, shape, layout and whole content into the hash `h`."""
    t = t.detach().to("cpu")
    h.update(f"{t.dtype}:{tuple(t.shape)}:{t.layout}".encode())
    if t.layout == torch.strided and not t.is_quantized:
        h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    else:  # sparse (its indices), quantized (its scale, zero point, axis): their serialized form
        buffer = io.BytesIO()
        torch.save(t, buffer)
        h.update(buffer.getvalue())


_MODULE_STATE = ("_parameters", "_buffers", "_modules", "training")  # fed apart, or the same in eval


def feed_value(h, value: Any, seen: set[int], depth: int = 0) -> None:
    """Feed `value` into `h`: tensors by `feed_tensor`, modules by their class, attributes (a setting,
    a hook), parameters, buffers and submodules, containers item by item, anything else by its repr (an
    object's default repr holds its address: two such objects never share a digest). `seen` holds the
    modules already fed (a shared module, or an attribute pointing back up, is fed by identity)."""
    if isinstance(value, torch.Tensor):
        feed_tensor(h, value)
    elif isinstance(value, torch.nn.Module):
        if id(value) in seen:
            h.update(f"module-again:{id(value)}".encode())
            return
        seen.add(id(value))
        h.update(f"module:{type(value).__module__}.{type(value).__qualname__}".encode())
        for name, item in vars(value).items():
            if name not in _MODULE_STATE:
                h.update(f"attr:{name}".encode())
                feed_value(h, item, seen, depth + 1)
        for group in ("_parameters", "_buffers", "_modules"):
            for name, item in vars(value)[group].items():
                h.update(f"{group}:{name}".encode())
                feed_value(h, item, seen, depth + 1)
    elif isinstance(value, dict) and depth < 8:
        h.update(f"dict:{len(value)}".encode())
        for key, item in value.items():
            h.update(repr(key).encode())
            feed_value(h, item, seen, depth + 1)
    elif isinstance(value, list | tuple) and depth < 8:
        h.update(f"{type(value).__name__}:{len(value)}".encode())
        for item in value:
            feed_value(h, item, seen, depth + 1)
    elif isinstance(value, dict | list | tuple):  # nested deeper than any model's settings: never shared
        h.update(f"deep:{id(value)}".encode())
    else:
        h.update(f"{type(value).__qualname__}:{value!r}".encode())
