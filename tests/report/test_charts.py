"""The report's charts say what they show without labels drawn over each other: the sweep's gates when two
targets are judged at different gates (the quickstart: bfloat16 at 1e-5, the others at 1e-4), the latency axes
over a range under a decade; and a cell's "needs atol" never reads as passing an atol of the sweep that the
check fails. Overlap is measured on the drawn figure (each label's box as matplotlib lays it out); the whole
page is then opened in Chromium and kept as a screenshot for a person to look at."""

from __future__ import annotations

import itertools
import os
import shutil

import pytest

from parity.records.summary import LatencyRow
from parity.report import plots
from parity.report.html import _atol
from tests.support import browser, tiny_experiment
from tests.support.cli import run_experiment


def overlapping_labels(fig) -> list[tuple[str, str]]:
    """Every pair of visible, non-empty texts of `fig` (tick labels, legend entries, titles, annotations) whose
    drawn boxes intersect."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # the layout engine places everything first
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
             and (t.axes is None or t.axes.get_visible())]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if box_a.width and box_b.width and box_a.overlaps(box_b)]


SWEEP = [1e-6, 1e-5, 1e-4, 1e-3]
QUICKSTART_GATES = {1e-4: ["compile-cpu", "onnxruntime-cpu", "torchscript-cpu"], 1e-5: ["eager-cpu-bfloat16"]}


@pytest.mark.parametrize("gates", [QUICKSTART_GATES, {1e-4: ["compile-cpu"], 2e-4: ["eager-cpu-int8-weight"]},
                                   {1e-4: ["a"]}])
def test_the_sweeps_gate_labels_never_overlap(gates):
    rates = {t: [0.0, 0.5, 1.0, 1.0] for ts in gates.values() for t in ts}
    fig = plots.sweep_figure(SWEEP, rates, gates)
    assert overlapping_labels(fig) == []
    from matplotlib.legend import Legend

    legend = [t.get_text() for lg in fig.findobj(Legend) for t in lg.get_texts()]
    for gate, targets in gates.items():  # every gate is named, with its targets when there are several gates
        assert any(text.startswith(f"gate {gate:g}") and (len(gates) == 1 or targets[0] in text) for text in legend)


def _rows(times: list[float], prepare: float) -> list[LatencyRow]:
    return [LatencyRow(model="resnet18", inputs="photos", backend=f"backend-{k}", device="cpu", dtype="float32",
                       status="ok", error=None, run_s=[t, t * 1.02, t * 0.98], prepare_s=prepare * (k + 1),
                       interleaved=True, median_s=t, min_s=t * 0.98, max_s=t * 1.02) for k, t in enumerate(times)]


@pytest.mark.parametrize("times, prepare", [([0.011, 0.013, 0.017], 1.2), ([0.0021, 0.0024], 0.31),
                                            ([1e-4, 0.5, 30.0], 0.02)])
def test_the_latency_axes_ticks_never_overlap(times, prepare):
    """Run times within one decade (matplotlib labels every minor tick then), and across five decades."""
    fig = plots.latency_figure(_rows(times, prepare))
    assert overlapping_labels(fig) == []
    run_ax = fig.axes[0]
    assert len([t for t in run_ax.get_xticklabels() if t.get_text()]) >= 2  # still a readable scale


@pytest.mark.parametrize("required, shown", [(1.04e-4, "1.04e-04"), (1.0412e-4, "1.05e-04"), (1e-4, "1.00e-04"),
                                             (9.996e-5, "1.00e-04"), (2.5e-6, "2.50e-06")])
def test_needs_atol_never_reads_below_the_atol_it_needs(required, shown):
    """1.04e-4 fails at 1e-4: "needs atol 1.0e-04" said the opposite of the sweep beside it."""
    assert _atol(required) == shown
    assert float(shown) >= required


@pytest.mark.skipif(browser.chromium() is None,
                    reason="chromium is not installed (apt-get install chromium; .ci/run tries to)")
def test_a_report_with_two_gates_in_chromium_screenshot(tmp_path):
    """The README demo's shape on the tiny model: a bfloat16 target at its dtype's gate beside float32 targets at
    the experiment's, so the sweep has two gates and the latency chart real run times. The page loads, every chart
    decodes, and its screenshot is kept (PARITY_SCREENSHOT_DIR, else the test's folder) for a person to look at."""
    exp = tiny_experiment([{"backend": "eager", "dtype": "bfloat16"}, {"backend": "torchscript"},
                           {"backend": "eager", "dtype": "float64"}])
    ran = run_experiment(exp, tmp_path)
    assert ran.code in (0, 1)
    page, shot = ran.out / "report.html", tmp_path / "report.png"
    images = "[...document.images].map(i => i.complete && i.naturalWidth > 0)"
    loaded = browser.load(page, [images], screenshot=shot)
    assert loaded.console_errors == [] and len(loaded.values[images]) >= 3 and all(loaded.values[images])
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("PARITY_SCREENSHOT_DIR"):
        shutil.copy(shot, os.environ["PARITY_SCREENSHOT_DIR"])


def test_a_cell_of_the_report_says_needs_atol_in_digits_that_agree_with_the_sweep():
    from parity.records.summary import summarize
    from parity.report.html import render_html
    from tests.report.test_report import quickstart_records

    records = quickstart_records(models=("resnet18",))
    records[-1].update(passed=False, failure_class="numeric_drift", detail="drift", required_atol=1.04e-4, max_abs=2e-4)
    html = render_html(records, summarize(records), "run")
    assert "needs atol 1.04e-04" in html and "needs atol 1.0e-04" not in html
