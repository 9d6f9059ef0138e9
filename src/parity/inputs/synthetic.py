"""Seeded synthetic tensors: the same spec and seed give the same tensor on every run and machine."""

from __future__ import annotations

import torch

from parity.inputs import Inputs


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
    if spec.distribution == "randint":
        return torch.randint(int(spec.low), int(spec.high), shape, generator=gen).to(dtype)
    if spec.distribution == "uniform":
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (spec.high - spec.low) + spec.low).to(dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def make_synthetic(spec, seed: int) -> Inputs:
    """One spec: one positional tensor; a list: positional tensors; a mapping: keyword tensors."""
    if isinstance(spec, list):
        return Inputs(tuple(_one(s, seed + i) for i, s in enumerate(spec)))
    if isinstance(spec, dict):
        return Inputs((), {name: _one(s, seed + i) for i, (name, s) in enumerate(spec.items())})
    return Inputs((_one(spec, seed),))
