"""JUnit XML for CI systems, from the records alone: one testcase per check (tier 1 and tier 3).

classname is `model/inputs`, name is `target tier N`; a failed check is a <failure> whose type is its
failure class and whose message is its detail; a target that could not run here is <skipped>. Every
problem a target has (it drifts, it cannot export the model, it raises) is a finding about the target,
so it is a failure. A check whose reference failed is a JUnit <error> (type `reference_error`): nothing
was found about the target, which was not run.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from parity.outdir import write_text
from parity.records.models import Check
from parity.records.summary import Summary
from parity.records.view import RunView
from parity.report import ReportWriter
from parity.report.next_steps import next_steps
from parity.report.wording import describe_note, flips_line

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")  # characters XML 1.0 cannot hold


def _clean(text: Any) -> str:
    return _NOT_XML.sub("?", str(text))


def _time(view: RunView, check: Check) -> float:
    """The target's own execution time on this model and input set: prepare plus every repeat."""
    return sum((r.prepare_s or 0.0) + (r.run_s or 0.0)
               for r in view.executions(model=check.model, inputs=check.inputs, backend=check.target))


def _body(check: Check, steps: list[str]) -> str:
    """The failure's text: the detail, what to do next, then the worst failing leaves (tier 1) or the
    metrics (tier 3)."""
    lines = [f"{check.failure_class}: {check.detail}", *steps]
    if check.tier == 1:
        if check.required_atol is not None:
            lines.append(f"required atol {check.required_atol:.3g} at rtol {check.rtol:g} (gate {check.gate:g})")
        for leaf in RunView.worst_leaves(check, 5):
            lines.append(f"  {leaf.name}: {leaf.failure_class}"
                         + (f", max abs {leaf.max_abs:.3g}" if leaf.max_abs is not None else "")
                         + (f" ({leaf.detail})" if leaf.detail else ""))
    else:
        lines += [f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}" for k, v in check.metrics.items()]
        lines += [f"  {e.side} box {e.index} (image {e.image}, label {e.label}, score {e.score:.4g}): "
                  f"{e.mechanism}: {e.detail}" for e in (check.flips.examples if check.flips else [])]
    return "\n".join(lines)


def render_junit(records: RunView | list[dict[str, Any]], summary: Summary, run_dir: str | Path) -> str:
    view = RunView.of(records)
    run, checks = view.run, view.checks()
    suite = ET.Element("testsuite", name=f"parity.{run.experiment}")
    props = ET.SubElement(suite, "properties")
    env = run.environment
    libraries = env.libraries if env.libraries is not None else ("torch", "torchvision", "onnxruntime", "openvino")  # older records
    for key in (*libraries, "python", "platform", "git_commit"):
        if env.version(key):
            ET.SubElement(props, "property", name=key, value=_clean(env.version(key)))
    if summary.gate is not None and summary.uniform_tolerance:  # else each testcase says its own
        ET.SubElement(props, "property", name="gate_atol", value=f"{summary.gate:g}")
        ET.SubElement(props, "property", name="rtol", value=f"{summary.rtol:g}")
    failures = skipped = errors = 0
    total_time = 0.0
    for check in checks:
        seconds = _time(view, check) if check.tier == 1 else 0.0
        total_time += seconds
        case = ET.SubElement(suite, "testcase", classname=_clean(f"{check.model}/{check.inputs}"),
                             name=_clean(f"{check.target} tier {check.tier}"), time=f"{seconds:.3f}")
        if check.tier == 1:  # the tolerance this check is judged at
            judged_at = ET.SubElement(case, "properties")
            ET.SubElement(judged_at, "property", name="gate_atol", value=f"{check.gate:g}")
            ET.SubElement(judged_at, "property", name="rtol", value=f"{check.rtol:g}")
        if check.status == "skipped":
            skipped += 1
            ET.SubElement(case, "skipped", message=_clean(check.detail or "not run"))
        elif check.status == "error":
            errors += 1
            error = ET.SubElement(case, "error", type=_clean(check.failure_class),
                                  message=_clean(f"{check.failure_class}: {check.detail}"))
            error.text = _clean("\n".join([check.detail, *next_steps(check, view, run_dir)]))
        elif not check.passed:
            failures += 1
            flips = flips_line(check)
            failure = ET.SubElement(case, "failure", type=_clean(check.failure_class),
                                    message=_clean(f"{check.failure_class}: {check.detail}"
                                                   + (f"; {flips}" if flips else "")))
            failure.text = _clean(_body(check, next_steps(check, view, run_dir)))
        if check.warnings:  # what the target warned of, whatever the verdict
            ET.SubElement(case, "system-out").text = _clean("\n".join(describe_note(n) for n in check.warnings))
    counts = {"tests": str(len(checks)), "failures": str(failures), "errors": str(errors), "skipped": str(skipped),
              "time": f"{total_time:.3f}"}
    suite.attrib.update(counts)
    root = ET.Element("testsuites", name="parity", **counts)
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(records: RunView | list[dict[str, Any]], summary: Summary, path: Path) -> None:
    write_text(path, render_junit(records, summary, path.parent))  # whole or not at all


WRITER = ReportWriter("junit", "junit.xml", write_junit)
