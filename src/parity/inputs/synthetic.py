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
    if spec.distribution == "randint" or not (dtype.is_floating_point):
        return torch.randint(int(spec.low), max(int(spec.high), int(spec.low) + 1), shape, generator=gen).to(dtype)
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
