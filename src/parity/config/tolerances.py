"""The tolerance a target is judged at: the experiment's, the target's own, or the default for its dtype;
and per output leaf, the first rule whose name or glob matches.

Why per dtype: a gate that means something for float32 (1e-4) fails every bfloat16 target, and loosening
the experiment's gate for them would loosen float32 too. A reduced-precision target that says nothing of
its tolerances is therefore judged at `torch.testing.assert_close`'s defaults for its dtype (the lower-
precision side of the pair). A quantized target (int8, int4) is judged at a scale-aware gate: a fraction of
the reference output's RMS (its scheme's `relative_gate`, dtypes.py), fixed per check when the judge sees the
reference's outputs (`Tolerance.at_scale`); the sweep keeps float32's atols, so its verdict at 1e-4 is still
reported. Float32 and float64 targets keep the experiment's. A default wins over the experiment's gate
(`shadowed` says so, for the warning), and the target's own gate wins over both.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from parity.dtypes import FLOATS, QUANTIZE_SCHEMES
from parity.records.models import LeafTolerance

DEFAULT_SWEEP = (1e-6, 1e-5, 1e-4, 1e-3)  # the experiment's atol sweep when it gives none
FLOAT_RTOL = 1e-5  # the experiment's rtol when it gives none (its gate: 1e-4, records.keys.gate_atol of the sweep)


def rounded_up(value: float, digits: int = 3) -> float:
    """`value` to `digits` significant digits, never below it: an atol printed or suggested from a required
    atol passes the check it came from (1.0412e-4 -> 1.05e-4; 1.0e-4 would fail it)."""
    if not math.isfinite(value) or value <= 0:
        return value
    shown = float(f"{value:.{digits}g}")
    if shown < value:
        shown = float(f"{shown + 10 ** (math.floor(math.log10(shown)) - digits + 1):.{digits}g}")
    return shown


def _less_precise(*dtypes: str):
    """The table entry (parity.dtypes) of the less precise of `dtypes`: its default tolerance is the pair's."""
    return min((FLOATS[d] for d in dtypes), key=lambda d: d.precision)


@functools.cache
def _glob(pattern: str) -> re.Pattern:
    """`*` any run of characters, `?` one; everything else literal, brackets too, so that
    `out[*]['boxes']` means every image's boxes (fnmatch would read `[*]` as a character class)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.S)


@dataclass(frozen=True)
class Tolerance:
    """A target's tolerances, resolved. `gate` is the atol of tier 1's verdict; with `by_task` the check's
    verdict comes from tier 3 instead, and tier 1's numbers are still recorded."""

    sweep: tuple[float, ...]
    rtol: float
    gate: float
    by_task: bool = False
    source: str = "experiment"  # experiment | target | default-for-<dtype> | default-for-<quantize word>
    rules: tuple[tuple[str, float | None, float | None, str], ...] = field(default=())  # pattern, atol, rtol, owner
    relative: float | None = None  # the gate is this fraction of the reference output's RMS (`at_scale` sets it)

    def at_scale(self, rms: float) -> Tolerance:
        """This tolerance for a check whose reference output's finite floating-point values have the root mean
        square `rms` (`outputs.float_rms`, which the judge measures only when `relative` is set): a scale-aware gate
        made an atol (`relative` x `rms`); unchanged without one, or at `rms` 0 (no floating-point value that is
        finite and not zero: the gate already holds the experiment's)."""
        if self.relative is None or not rms:
            return self
        return replace(self, gate=float(f"{self.relative * rms:.3g}"))

    def for_leaf(self, name: str) -> LeafTolerance:
        """The leaf's tolerance (the leaf record's own part; `atol` None: the check's gate and sweep apply): an
        output rule naming it exactly wins, then the first glob that matches (the target's rules before the
        experiment's), else the check's."""
        exact = [r for r in self.rules if r[0] == name]
        globbed = [r for r in self.rules if r[0] != name and _glob(r[0]).fullmatch(name)]
        for pattern, atol, rtol, owner in exact + globbed:
            return LeafTolerance(atol=atol, rtol=self.rtol if rtol is None else rtol,
                                 rule=f"{owner} output rule '{pattern}'")
        return LeafTolerance(atol=None, rtol=self.rtol, rule=None)


def resolve(experiment_tolerances: Any, target: Any, reference_dtype: str) -> Tolerance:
    """The tolerance of `target` (a BackendSpec) under the experiment's `tolerances` (config.schema.Tolerances).
    Each of rtol and the gate comes from the first that has it: the target's own `tolerances`, the default of a
    reduced-precision dtype, the experiment's (its `gate_atol`: 1e-4 when swept and nobody gives one). The
    Python API resolves its call's atol and rtol here too, as a target's own. `gate:
    tier3` (the target's, else the experiment's) keeps tier 1's numbers but lets tier 3 decide the verdict."""
    exp, own = experiment_tolerances, target.tolerances
    given = own.model_fields_set & {"rtol", "gate", "outputs"} if own is not None else set()
    lower = _less_precise(target.dtype, reference_dtype)
    dtype_rtol, dtype_atol = lower.default_tolerance or (None, None)
    sweep = list(exp.atol)
    gate_setting = own.gate if "gate" in given else exp.gate
    numeric = [g for g in (own.gate if "gate" in given else None, dtype_atol) if isinstance(g, float | int)]
    gate = numeric[0] if numeric else exp.gate_atol
    rtol = next(r for r in (own.rtol if "rtol" in given else None, dtype_rtol, exp.rtol) if r is not None)
    source = "target" if given else (f"default-for-{lower.name}" if dtype_atol is not None else "experiment")
    scheme = QUANTIZE_SCHEMES[target.quantize.scheme] if getattr(target, "quantize", None) is not None else None
    relative = None
    if scheme is not None and "gate" not in given and exp.gate != "tier3":  # int8/int4: scale-aware by default
        relative, source = scheme.relative_gate, f"default-for-{scheme.word}"
    rules = [(p, r.atol, r.rtol, "target") for p, r in (own.outputs.items() if own is not None else ())]
    rules += [(p, r.atol, r.rtol, "experiment") for p, r in exp.outputs.items()]
    return Tolerance(tuple(sorted(set(sweep))), rtol, float(gate), gate_setting == "tier3", source, tuple(rules),
                     relative)


def shadowed(experiment_tolerances: Any, target: Any, reference_dtype: str) -> str | None:
    """Why the experiment's own numeric `gate` does not apply to `target` (a default of its dtype or quantize
    scheme wins over it), in words for a warning that says where to put it; None when it applies."""
    exp = experiment_tolerances
    own = target.tolerances.model_fields_set if target.tolerances is not None else set()
    if "gate" not in exp.model_fields_set or not isinstance(exp.gate, float | int) or "gate" in own:
        return None
    tol = resolve(exp, target, reference_dtype)
    if tol.source == "experiment":
        return None
    default = (f"{tol.relative:g} of the reference output's rms" if tol.relative is not None
               else f"atol {tol.gate:g}")
    return (f"tolerances.gate {exp.gate:g} does not apply to target {target.id}: it is judged at its "
            f"{tol.source.removeprefix('default-for-')} default ({default}); to judge it at {exp.gate:g}, set "
            f"`tolerances: {{gate: {exp.gate:g}}}` in that target's own entry")
