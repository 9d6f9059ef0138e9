"""Seeded synthetic tensors: the same spec and seed give the same tensor on every run and machine."""

from __future__ import annotations

import torch

from parity.inputs.base import Inputs
from parity.inputs.images import constant_value

RANDOM = ("normal", "uniform", "randint")


def _one(spec, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(spec.seed if spec.seed is not None else seed)
    dtype = getattr(torch, spec.dtype)
    shape = tuple(spec.shape)
    if spec.distribution == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if spec.distribution == "ones":
        return torch.ones(shape, dtype=dtype)
    if dtype == torch.bool:  # randint (or any draw) for a mask: True and False alike
        return torch.randint(0, 2, shape, generator=gen).to(torch.bool)
    if spec.distribution == "randint":  # low and high are integers within the dtype's range (schema)
        return torch.randint(int(spec.low), int(spec.high), shape, generator=gen).to(dtype)
    if spec.distribution == "uniform":
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (spec.high - spec.low) + spec.low).to(dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def _drawn(name: str, spec, seed: int, notes: list[str]) -> torch.Tensor:
    """One tensor; a random draw whose values all came out the same (randint over one value, a
    uniform range narrower than the dtype's resolution) is noted: zeros and ones are asked for."""
    t = _one(spec, seed)
    value = constant_value(t) if spec.distribution in RANDOM else None
    if value is not None:
        notes.append(f"{name}: every value of its {spec.distribution} draw is {value:g}, a constant input on "
                     "which any backend agrees; widen low/high")
    return t


def make_synthetic(spec, seed: int) -> Inputs:
    """One spec: one positional tensor; a list: positional tensors; a mapping: keyword tensors."""
    notes: list[str] = []
    if isinstance(spec, list):
        return Inputs(tuple(_drawn(f"tensor {i}", s, seed + i, notes) for i, s in enumerate(spec)), notes=tuple(notes))
    if isinstance(spec, dict):
        kwargs = {name: _drawn(f"tensor '{name}'", s, seed + i, notes) for i, (name, s) in enumerate(spec.items())}
        return Inputs((), kwargs, notes=tuple(notes))
    return Inputs((_drawn("its tensor", spec, seed, notes),), notes=tuple(notes))
