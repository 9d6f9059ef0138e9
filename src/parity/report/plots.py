"""The report's charts, drawn with matplotlib (no pyplot, so no global state or display) and returned as
`data:` URIs of SVG images: the HTML embeds them and fetches nothing.

Every function takes plain numbers already read from the records (depth_plot: a `layers` record, as its model)
and returns one image.
"""

from __future__ import annotations

import base64
import io
import logging
import math
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parity.records.models import Layers
    from parity.records.summary import LatencyRow

PASS, FAIL, NEUTRAL = "#1a7f37", "#cf222e", "#8c959f"

log = logging.getLogger(__name__)
# matplotlib's font messages (a font cache being built, a family not found) are about drawing the report,
# not about the model: kept off the console, whose stderr logging would otherwise reach.
logging.getLogger("matplotlib").setLevel(logging.ERROR)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def data_uri(fig, fmt: str = "svg", dpi: int = 100, tight: bool = False) -> str:
    """The figure as a base64 `data:` URI (SVG for charts, PNG for photographs); `tight` crops the margins."""
    import matplotlib

    buf = io.BytesIO()
    extra = {"bbox_inches": "tight", "pad_inches": 0.04} if tight else {}
    with matplotlib.rc_context({"svg.hashsalt": "parity", "svg.fonttype": "path"}), \
            warnings.catch_warnings(record=True) as caught:  # stable, font-independent output
        warnings.simplefilter("always")
        fig.savefig(buf, format=fmt, dpi=dpi, metadata={"Date": None} if fmt == "svg" else None, **extra)
    for warning in caught:  # a glyph missing from the font, a layout that did not fit: --verbose shows them
        log.debug("while drawing the report: %s", warning.message)
    mime = "image/svg+xml" if fmt == "svg" else f"image/{fmt}"
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _short(name: str, limit: int = 28) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def pass_rate_heatmap(models: list[str], targets: list[str], rates: dict[tuple[str, str], float | None]) -> str:
    """Rows models, columns targets, colour the share of passing verdicts over the tolerance sweep
    (grey where the target did not run)."""
    import numpy as np
    from matplotlib import colormaps

    grid = np.full((len(models), len(targets)), np.nan)
    for i, m in enumerate(models):
        for j, t in enumerate(targets):
            if rates.get((m, t)) is not None:
                grid[i, j] = rates[(m, t)]
    fig = _figure(min(2.0 + 1.25 * len(targets), 11.0), 0.9 + 0.5 * len(models))
    ax = fig.add_subplot()
    cmap = colormaps.get_cmap("RdYlGn").with_extremes(bad="#d0d7de")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for i in range(len(models)):
        for j in range(len(targets)):
            value = grid[i, j]
            text = "n/a" if math.isnan(value) else f"{value:.0%}"
            ax.text(j, i, text, ha="center", va="center", fontsize=9,
                    color="black" if math.isnan(value) or 0.25 < value < 0.85 else "white")
    ax.set_xticks(range(len(targets)), [_short(t, 20) for t in targets], rotation=20, ha="right", fontsize=9)
    ax.set_yticks(range(len(models)), [_short(m) for m in models], fontsize=9)
    ax.tick_params(length=0)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, format=lambda v, _: f"{v:.0%}").ax.tick_params(labelsize=8)
    return data_uri(fig)


def sweep_curve(atols: list[float], rates: dict[str, list[float]], gates: dict[float, list[str]]) -> str:
    return data_uri(sweep_figure(atols, rates, gates))


def sweep_figure(atols: list[float], rates: dict[str, list[float]], gates: dict[float, list[str]]):
    """Share of each target's checks that pass at each atol of the sweep, on a log axis; a dashed line at each
    gate the targets are judged at. The gates are named in a legend of their own under the axis, each line in its
    own dash pattern: labels over the plot overlapped wherever two gates were near on the axis (1e-5 and 1e-4)."""
    from matplotlib.ticker import PercentFormatter

    fig = _figure(7.5, 3.6 + 0.18 * max(0, len(gates) - 2))
    ax = fig.add_subplot()
    markers = "osD^v<>ph*"
    n = len(rates)
    for k, (target, values) in enumerate(rates.items()):
        # targets with the same rates would hide each other: earlier lines are wider and drawn below, so
        # coinciding lines show as nested bands instead of one
        width = 1.5 + 2.5 * (n - 1 - k) / max(1, n - 1)
        ax.plot(atols, values, marker=markers[k % len(markers)], linewidth=width, markersize=3 + width,
                alpha=0.85, zorder=2 + k, label=target)
    dashes = [(4, 2), (1, 1.5), (6, 2, 1, 2), (2, 3)]
    gate_lines = []
    for k, (gate, targets) in enumerate(sorted(gates.items())):
        label = f"gate {gate:g}" + (f": {', '.join(_short(t, 24) for t in targets)}" if len(gates) > 1 else "")
        gate_lines.append(ax.axvline(gate, color=NEUTRAL, linestyle=(0, dashes[k % len(dashes)]), linewidth=1.2,
                                     label=_short(label, 64)))
    ax.set_xscale("log")
    if len(atols) == 1:
        ax.set_xlim(atols[0] / 3, atols[0] * 3) if atols[0] > 0 else None
    ax.set_ylim(-0.05, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("atol (log scale)")
    ax.set_ylabel("checks passing")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(handles=ax.get_lines()[:n], fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.legend(handles=gate_lines, fontsize=8, loc="outside lower left", frameon=False,  # under the axis, laid out
               ncol=1 if len(gate_lines) > 2 else len(gate_lines))
    return fig


def taxonomy_bars(counts: dict[str, dict[int, int]]) -> str:
    """Failed checks per failure class, one bar per tier."""
    classes = list(counts)
    tiers = sorted({tier for per in counts.values() for tier in per})
    fig = _figure(6.0, 0.9 + 0.32 * len(classes) * max(1, len(tiers)) ** 0.5)
    ax = fig.add_subplot()
    height = 0.8 / max(1, len(tiers))
    colours = {1: FAIL, 2: "#9a6700", 3: "#8250df"}
    for k, tier in enumerate(tiers):
        ys = [i + (k - (len(tiers) - 1) / 2) * height for i in range(len(classes))]
        values = [counts[c].get(tier, 0) for c in classes]
        bars = ax.barh(ys, values, height=height * 0.95, color=colours.get(tier, NEUTRAL), label=f"tier {tier}")
        ax.bar_label(bars, labels=[str(v) if v else "" for v in values], padding=3, fontsize=8)
    ax.set_yticks(range(len(classes)), classes, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("failed checks")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.margins(x=0.12)
    if len(tiers) > 1:
        ax.legend(fontsize=8, frameon=False)
    return data_uri(fig)


def latency_chart(rows: list[LatencyRow]) -> str:
    return data_uri(latency_figure(rows))


def latency_figure(rows: list[LatencyRow]):
    """Left: run time of every repeat (dots) and their median (bar), per model and backend; right: the
    one-time prepare cost (export, compile, load) apart, on its own scale. Both log scales, labelled at a few
    round values (`_few_ticks`): matplotlib's own labels every minor tick of a range under a decade, and they
    overlapped."""
    import numpy as np

    one_job = len({(r.model, r.inputs) for r in rows}) == 1  # then the backend alone names a row
    labels = [_short(r.backend, 32) if one_job else f"{_short(r.model, 24)} / {_short(r.backend, 24)}"
              for r in rows]
    fig = _figure(9.0, 1.0 + 0.32 * len(rows))
    run_ax, prep_ax = fig.subplots(1, 2, sharey=True, width_ratios=[3, 2])
    ys = np.arange(len(rows))
    for y, r in zip(ys, rows, strict=True):
        if r.run_s:
            run_ax.barh(y, r.median_s, height=0.6, color="#54aeff", alpha=0.55)
            run_ax.scatter(r.run_s, [y] * len(r.run_s), s=14, color="#0969da", zorder=3)
        if r.prepare_s:
            prep_ax.barh(y, r.prepare_s, height=0.6, color="#bf8700", alpha=0.75)
            prep_ax.text(r.prepare_s, y, f" {r.prepare_s:.3g} s", va="center", fontsize=7)
    run_ax.set_yticks(ys, labels, fontsize=8)
    run_ax.invert_yaxis()
    for ax, title, most in ((run_ax, "run time per repeat (s): dots; median: bar", 6), (prep_ax, "prepare, once (s)", 4)):
        if ax.has_data():
            ax.set_xscale("log")
            _few_ticks(ax, most)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="x", which="major", alpha=0.3)
    prep_ax.margins(x=0.25)
    return fig


def _few_ticks(ax, most: int) -> None:
    """At most `most` labelled ticks on a log x axis, at 1, 2 and 5 times a power of ten (every other power when
    the range is wide; a range with fewer than two of them widened to the round values around it), and no labels
    on the minor ticks."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    low, high = ax.get_xlim()
    if not (low > 0 and high > low):
        return
    steps = [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 2)
             for m in (1, 2, 5)]
    ticks = [t for t in steps if low <= t <= high]
    if len(ticks) < 2:  # a narrow range (0.011 to 0.019 s): widened to the round values around it
        low, high = max(t for t in steps if t <= low), min(t for t in steps if t >= high)
        ax.set_xlim(low, high)
        ticks = [t for t in steps if low <= t <= high]
    for subset in (ticks, [t for t in ticks if f"{t:.0e}"[0] in "15"], [t for t in ticks if f"{t:.0e}"[0] == "1"]):
        if len(subset) <= most:
            ticks = subset
            break
    else:
        ticks = [t for t in ticks if f"{t:.0e}"[0] == "1"]
        ticks = ticks[::math.ceil(len(ticks) / most)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=8)


def depth_plot(record: Layers) -> str | None:
    """Tier 2: each layer's relative RMSE against its place in the forward (call order), one panel per
    level of the descent (the layer descended into is marked), local (own) and propagated errors."""
    levels = [lv for lv in record.levels or [] if lv.layers]
    if not levels:
        return None
    suspects = {s.name for s in record.suspects or []}
    chosen = [lv.parent for lv in levels[1:]] + [record.culprit]
    widest = max(len(lv.layers) for lv in levels)
    fig = _figure(min(max(8.0, 0.3 * widest + 4.0), 12.0), 2.4 * len(levels) + 0.4)
    axes = fig.subplots(len(levels), 1, squeeze=False)[:, 0]
    floor = 1e-12  # a layer with no error at all is drawn at the bottom of the log axis, not dropped
    for ax, level, picked in zip(axes, levels, chosen, strict=True):
        layers = level.layers
        xs = list(range(len(layers)))

        def values(mode: str, layers=layers) -> list[float]:
            out = []
            for layer in layers:
                stats = getattr(layer, mode)  # local or propagated: a LayerError, or None
                v = None if stats is None or stats.error else stats.rel_rmse
                out.append(float("nan") if v is None else max(v, floor))
            return out

        local, propagated = values("local"), values("propagated")
        if not all(math.isnan(v) for v in propagated):
            ax.plot(xs, propagated, color="#8250df", marker=".", linewidth=1.2, label="propagated (end to end)")
        if not all(math.isnan(v) for v in local):
            ax.plot(xs, local, color="#0969da", marker="o", markersize=4, linewidth=1.2, label="local (own error)")
        for x, layer in zip(xs, layers, strict=True):
            if layer.name == picked:
                ax.axvspan(x - 0.3, x + 0.3, color="#ffd8b5", alpha=0.7, zorder=0)
        prefix = f"{level.parent}." if level.parent else ""
        # names relative to the parent, unless that leaves a bare index (layer3.0 -> "0" says nothing)
        names = [n[len(prefix):] if n.startswith(prefix) and not n[len(prefix):].isdigit() else n
                 for n in (layer.name for layer in layers)]
        ax.set_xticks(xs, [_short(n, 18) for n in names], rotation=45 if len(xs) > 6 else 0,
                      ha="right" if len(xs) > 6 else "center", fontsize=7)
        ax.set_xlim(-0.6, len(xs) - 0.4)
        for tick, layer in zip(ax.get_xticklabels(), layers, strict=True):
            if layer.name in suspects:
                tick.set_color(FAIL)
                tick.set_fontweight("bold")
        if ax.has_data():
            ax.set_yscale("log")
        ax.set_ylabel("relative RMSE", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(f"layers of {level.parent or 'the model'} (call order)", fontsize=9, loc="left")
        ax.grid(True, axis="y", alpha=0.3)
        own = level.own_code
        if own and not own.error and own.rel_rmse is not None:
            ax.axhline(max(own.rel_rmse, floor), color="#bf8700", linestyle=":", linewidth=1,
                       label="the parent's own code")
        ax.plot([], [], color="#ffd8b5", linewidth=8, label="descended into / culprit")
    handles: dict[str, Any] = {}
    for ax in axes:  # one legend for every panel, outside them, so that it never hides a point
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="outside upper right", ncols=len(handles), fontsize=7,
               frameon=False)
    return data_uri(fig)


def kld_histogram(edges: list[float], counts: list[int], target: str) -> str:
    """One target's scored positions per decade of KL(reference || target) (text generation's tier 3): the
    shape of the distribution whose mean, percentiles and maximum the statistics table gives."""
    fig = _figure(4.2, 2.2)
    ax = fig.add_subplot()
    labels = [f"<{edges[0]:.0e}", *(f"{a:.0e}" for a in edges[:-1]), f">{edges[-1]:.0e}"]
    ax.bar(range(len(counts)), counts, color=NEUTRAL)
    ax.set_xticks(range(len(counts)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("positions", fontsize=8)
    ax.set_title(f"{_short(target, 40)}: KL per position (decades)", fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    return data_uri(fig)
