"""Every extension point is a registry filled from entry points: parity's own plugins and a third party's
(tests/plugin_demo, a package with a hand-written dist-info) are found the same way, each validates its
own spec, and the reports read a task's headline metrics from the task."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import parity
from parity import plugins
from parity.api import assert_backends_agree
from parity.backends.base import Backend
from parity.cli import main
from parity.errors import ParityError
from parity.experiment import experiment_from_dict, load_experiment
from parity.outputs import map_tensors
from parity.registry import Registry
from tests.fixtures.tiny import tiny_cnn
from tests.support import tiny_experiment

DEMO = Path(__file__).parent / "plugin_demo"
BUILTINS = {
    plugins.BACKENDS: {"eager", "compile", "onnxruntime", "torchscript", "openvino"},
    plugins.SOURCES: {"torchvision", "repo", "python"},
    plugins.TASKS: {"classification", "detection", "segmentation"},
    plugins.ADAPTERS: {"deterministic_nms"},
    plugins.EXECUTORS: {"local", "process", "ray"},
    plugins.REPORTS: {"markdown", "html", "junit"},
}


@pytest.fixture
def demo():
    """tests/plugin_demo on sys.path, as if pip had installed it; gone again afterwards."""
    sys.path.insert(0, str(DEMO))
    plugins.refresh()
    yield
    sys.path.remove(str(DEMO))
    for name in [m for m in sys.modules if m == "parity_demo" or m.startswith("parity_demo.")]:
        del sys.modules[name]
    plugins.refresh()


def demo_experiment(gate: float, max_change: float, nudge: float = 1e-3) -> dict:
    return {
        "name": "demo",
        "models": [{"name": "mlp", "source": "demo", "width": 8, "task": "agreement"}],
        "inputs": [{"name": "rows", "synthetic": {"shape": [3, 4]}}],
        "targets": [{"backend": "nudged", "options": {"nudge": nudge}}],
        "tolerances": {"atol": [gate / 10, gate], "gate": gate},
        "tiers": {"tasks": {"agreement": {"max_change": max_change}}},
    }


def test_the_builtins_are_registered_through_parity_s_own_entry_points():
    for registry, names in BUILTINS.items():
        assert names <= set(registry.names()), registry.group
        assert all(registry.get(n).name == n for n in names if registry is not plugins.BACKENDS)


def test_without_parity_s_entry_points_every_lookup_says_to_install_it(monkeypatch, write_yaml, capsys):
    """parity on PYTHONPATH only (no installed metadata, or metadata older than the source): one message."""
    monkeypatch.setattr("parity.registry.entry_points", lambda group: [])
    registry = Registry("model source", "parity.sources", "parity.models.sources:Source")
    with pytest.raises(ParityError, match=r"'parity.sources' entry points.*pip install -e \."):
        registry.names()
    plugins.refresh()
    try:
        assert main(["validate", str(write_yaml(tiny_experiment([{"backend": "torchscript"}])))]) == 2
    finally:
        monkeypatch.undo()
        plugins.refresh()
    err = capsys.readouterr().err
    assert "pip install -e ." in err and "Traceback" not in err


def test_refresh_rescans_the_entry_points():
    assert "demo" not in plugins.SOURCES.names()  # scanned (and remembered) before the package is on the path
    sys.path.insert(0, str(DEMO))
    try:
        assert "demo" not in plugins.SOURCES.names()
        plugins.refresh()
        assert "demo" in plugins.SOURCES.names() and "agreement" in plugins.TASKS.names()
    finally:
        sys.path.remove(str(DEMO))
        plugins.refresh()
    assert "demo" not in plugins.SOURCES.names()


def test_a_source_validates_its_own_keys(demo, write_yaml):
    data = demo_experiment(1e-2, 1e-2)
    exp = experiment_from_dict(data)
    assert type(exp.models[0]).__name__ == "DemoSpec" and exp.models[0].width == 8
    assert exp.model_dump()["models"][0]["width"] == 8  # the record's config keeps the source's own keys
    data["models"][0].update(width=0, widht=3)
    with pytest.raises(ParityError) as info:
        load_experiment(write_yaml(data))
    problems = "\n".join(info.value.problems)
    assert ":5: models[0].width: Input should be greater than or equal to 1" in problems
    assert "models[0].widht: unknown key; did you mean 'width'? (allowed here: name, source," in problems


def test_keys_of_another_source_and_unknown_sources_are_named(write_yaml):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["models"] = [{"name": "a", "source": "torchvision", "builder": "resnet18", "entry": "m:f"},
                      {"name": "b", "source": "torchvisoin", "builder": "resnet18"}]
    with pytest.raises(ParityError) as info:
        load_experiment(write_yaml(data))
    problems = "\n".join(info.value.problems)
    assert "models[0].entry: unknown key (allowed here: name, source, weights, init, seed, params, task, inputs, export_inputs, batch, adapters, builder)" in problems
    assert ("models[1].source: unknown model source 'torchvisoin'; did you mean 'torchvision'? "
            f"(known: {', '.join(plugins.SOURCES.names())})") in problems
    assert {"exported", "onnx", "python", "repo", "timm", "torchscript", "torchvision", "transformers"} <= set(plugins.SOURCES.names())
    assert "exp.yaml:9: models[1].source" in problems


def test_task_thresholds_live_under_their_task_and_the_flat_spelling_still_counts(write_yaml, capsys):
    data = tiny_experiment([{"backend": "torchscript"}], tiers={"tasks": {"classification": {"top1_agreement": 0.5}}})
    assert experiment_from_dict(data).tiers.tasks.classification.top1_agreement == 0.5
    assert capsys.readouterr().err == ""
    data["tiers"] = {"tasks": {"top1_agreement": 0.25, "detection_f1": 0.5}}
    exp = load_experiment(path := write_yaml(data))
    assert exp.tiers.tasks.classification.top1_agreement == 0.25 and exp.tiers.tasks.detection.f1 == 0.5
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {path}:19: tiers.tasks.top1_agreement is deprecated; write "
                   "tiers.tasks.classification.top1_agreement",
                   f"warning: {path}:20: tiers.tasks.detection_f1 is deprecated; write tiers.tasks.detection.f1"]


@pytest.mark.parametrize("tiers, expected", [
    ({"tasks": {"classification": {"top1_agreement": 2}}}, "tiers.tasks.classification.top1_agreement: Input should be"),
    ({"tasks": {"classifcation": {}}}, "tiers.tasks.classifcation: unknown key; did you mean 'classification'?"),
    ({"tasks": {"detection": {"detection_f1": 0.5}}}, "tiers.tasks.detection.detection_f1: unknown key (allowed here: iou, f1, attribution)"),
])
def test_task_thresholds_are_validated_by_their_task(write_yaml, tiers, expected):
    with pytest.raises(ParityError) as info:
        load_experiment(write_yaml(tiny_experiment([{"backend": "torchscript"}], tiers=tiers)))
    assert any(expected in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("change, expected", [
    ({"models": [{"name": "m", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "task": "clasification"}]},
     "models[0].task: unknown task 'clasification'; did you mean 'classification'?"),
    ({"adapters": ["deterministic_nm"]}, "adapters[0].name: unknown adapter 'deterministic_nm'; did you mean 'deterministic_nms'?"),
    ({"adapters": [{"name": "deterministic_nms", "box_gird": 2}]}, "adapters[0].box_gird: unknown key; did you mean 'box_grid'?"),
    ({"executor": "proces"}, "executor.kind: unknown executor 'proces'; did you mean 'process'?"),
    ({"executor": {"kind": "process", "timout": 5}}, "executor.timout: unknown key; did you mean 'timeout'?"),
])
def test_each_plugin_name_and_spec_is_checked(write_yaml, change, expected):
    with pytest.raises(ParityError) as info:
        load_experiment(write_yaml(tiny_experiment([{"backend": "torchscript"}], **change)))
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_backend_metadata_replaces_the_tables_that_named_backends():
    from parity.backends import backend_class, fallback_kind
    from parity.backends.base import Backend, CapturesLayers
    from parity.config.schema import BackendSpec

    assert Backend.fallback_kind is None and not issubclass(Backend, CapturesLayers)
    assert issubclass(backend_class("onnxruntime"), CapturesLayers)
    assert not issubclass(backend_class("torchscript"), CapturesLayers)
    assert fallback_kind(BackendSpec(backend="compile")) == "eager"
    assert fallback_kind(BackendSpec(backend="onnxruntime", dtype="float16")) == "float32"
    with pytest.raises(ParityError, match="fallback applies to compile targets"):
        fallback_kind(BackendSpec(backend="torchscript"))


def test_reports_show_a_task_s_headline_metrics_and_list_an_unknown_task_s(demo):
    """The console names the headline metrics of an installed task; a task not installed here shows every
    metric its record has. The HTML marks a lower-is-better metric above its threshold."""
    from parity.records.models import Tier3Check
    from parity.report.html import _tier3_tables
    from parity.report.wording import headline_figures

    check = {"kind": "check", "tier": 3, "model": "m", "inputs": "i", "reference": "eager-cpu", "target": "t",
             "task": "agreement", "status": "ok", "passed": False, "failure_class": "decision_flip", "detail": None,
             "metrics": {"max_change": 0.5, "outputs": 1}, "thresholds": {"max_change": 0.1}, "same_set": False}
    [table] = _tier3_tables([Tier3Check.model_validate(check),
                             Tier3Check.model_validate({**check, "target": "u", "metrics": {"max_change": 0.05, "outputs": 1}})])
    assert [[c["low"] for c in row["cells"]] for row in table["rows"]] == [[True, False], [False, False]]
    assert table["columns"][0].threshold == 0.1

    assert headline_figures(Tier3Check.model_validate(check)) == "max_change 0.5"
    assert headline_figures(Tier3Check.model_validate({**check, "task": "not-installed", "metrics": {"score": 0.25, "items": 3}})) \
        == "score 0.25, items 3"


def test_a_third_party_source_task_and_backend_run_through_parity_run(demo, write_yaml, tmp_path, capsys):
    """The nudge (1e-3, exactly) fails tier 1 and tier 3 at 1e-4 and passes both at 1e-2."""
    tight, loose = tmp_path / "tight", tmp_path / "loose"
    assert main(["run", str(write_yaml(demo_experiment(1e-4, 1e-4), "tight.yaml")), "--out", str(tight)]) == 1
    assert main(["run", str(write_yaml(demo_experiment(1e-2, 1e-2), "loose.yaml")), "--out", str(loose)]) == 0
    for out, passed in ((tight, False), (loose, True)):
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        checks = {r["tier"]: r for r in records if r["kind"] == "check"}
        assert checks[1]["passed"] is passed and checks[3]["passed"] is passed, out
        assert checks[3]["task"] == "agreement" and abs(checks[3]["metrics"]["max_change"] - 1e-3) < 1e-6
        assert checks[1]["failure_class"] is None if passed else checks[1]["failure_class"]
        # max_change is lower-is-better (the demo task's headline): its column's threshold reads as a ceiling
        assert re.search(r'<span class="small">≤ [0-9.e-]+</span>', (out / "report.html").read_text()), out
    capsys.readouterr()


def test_a_plugin_on_pythonpath_is_found_by_a_fresh_parity_process(write_yaml, tmp_path):
    """No pip install, no refresh: the dist-info on PYTHONPATH is enough for a new interpreter."""
    path = write_yaml(demo_experiment(1e-2, 1e-2, nudge=0.0))
    src = str(Path(parity.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DEMO), src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "parity.cli", "validate", str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "valid" in done.stdout


def test_how_images_are_batched_is_the_task_s_default_unless_the_model_says():
    from parity.config.schema import model_spec

    entry = {"name": "m", "source": "python", "entry": "tests.fixtures.tiny:tiny_detector"}
    assert model_spec({**entry, "task": "detection"}).batch_mode == "list"  # detectors take a list of images
    assert model_spec({**entry, "task": "classification"}).batch_mode == "stack"
    assert model_spec(entry).batch_mode == "stack"  # task: other
    assert model_spec({**entry, "task": "detection", "batch": "stack"}).batch_mode == "stack"


def test_the_html_reads_a_threshold_from_records_of_either_spelling():
    """Records written before tasks were plugins hold the flat thresholds (`detection_f1`)."""
    from parity.records.models import Tier3Check
    from parity.report.html import _tier3_tables

    check = {"kind": "check", "tier": 3, "model": "m", "inputs": "i", "reference": "eager-cpu", "target": "t",
             "task": "detection", "status": "ok", "passed": False, "failure_class": "decision_flip", "detail": None,
             "metrics": {"f1": 0.5}, "same_set": False}
    for thresholds in ({"iou": 0.5, "f1": 0.9}, {"detection_iou": 0.5, "detection_f1": 0.9, "top1_agreement": 0.99}):
        [table] = _tier3_tables([Tier3Check.model_validate({**check, "thresholds": thresholds})])
        assert table["columns"][0].threshold == 0.9 and table["rows"][0]["cells"][0]["low"] is True


def test_another_source_s_key_left_null_is_accepted_as_before():
    """Runs recorded when one spec held every source's keys have `entry: null` under torchvision in their
    `config`; such an experiment validates again (parity reduce rebuilds it), a set one is still refused."""
    from parity.config.schema import model_spec

    old = {"name": "v", "source": "torchvision", "builder": "resnet18", "path": None, "entry": None, "hubconf": None}
    assert model_spec(old).model_dump()["builder"] == "resnet18"
    with pytest.raises(ValueError, match="entry"):
        model_spec({**old, "entry": "m:f"})


def test_a_plugin_that_cannot_be_imported_is_named(monkeypatch):
    from types import SimpleNamespace

    def missing():
        raise ModuleNotFoundError("No module named 'theirlib'")

    own = SimpleNamespace(metadata={"Name": "parity"})
    found = [SimpleNamespace(name="theirs", value="theirlib.parity:TASK", load=missing, dist=own)]
    monkeypatch.setattr("parity.registry.entry_points", lambda group: found)
    with pytest.raises(ParityError, match=r"cannot load task 'theirs' \(entry point in 'parity.tasks'\): No module named 'theirlib'"):
        Registry("task", "parity.tasks", "parity.verify.tasks:Task").get("theirs")


def _registered(monkeypatch, group: str, name: str, value: str):
    """Every group's real entry points and, in `group`, one more, `name = value`, as a package of its own registers it."""
    from importlib.metadata import EntryPoint
    from importlib.metadata import entry_points as real

    extra = EntryPoint(name, value, group)
    monkeypatch.setattr("parity.registry.entry_points",
                        lambda group: [*real(group=group), *([extra] if group == extra.group else [])])


@pytest.mark.parametrize("registry, value, wanted", [
    (plugins.BACKENDS, "tests.fixtures.tiny:TinyCNN", "a subclass of parity.backends.base.Backend"),
    (plugins.BACKENDS, "parity.backends.eager:call_lines", "a subclass of parity.backends.base.Backend"),
    (plugins.TASKS, "parity.verify.tasks.classification:Classification", "an instance of parity.verify.tasks.Task"),
    (plugins.SOURCES, "parity.verify.tasks.classification:TASK", "an instance of parity.models.sources.Source"),
    (plugins.REPORTS, "parity.adapters.nms:ADAPTER", "an instance of parity.report.ReportWriter"),
])
def test_a_plugin_that_is_not_what_its_registry_holds_is_refused_naming_its_entry_point(monkeypatch, registry,
                                                                                       value, wanted):
    _registered(monkeypatch, registry.group, "impostor", value)
    registry.refresh()
    try:
        with pytest.raises(ParityError) as raised:
            registry.get("impostor")
        assert registry.get(next(n for n in registry.names() if n != "impostor"))  # the group's own still load
    finally:
        monkeypatch.undo()
        registry.refresh()
    message = str(raised.value)
    assert "\n" not in message and f"entry point 'impostor = {value}' in '{registry.group}'" in message, message
    assert message.endswith(f"not {wanted}"), message


# --- the plugin contract: a third party's backend against the core alone (prepare, run, close), in under 40 lines --
class Float64Runtime(Backend):
    """A third party's runtime: runs the model in float64 and hands float32 back, as a deployment would."""

    name = "float64-runtime"

    def prepare(self, model, example):
        self.model = model.double().eval()

    def run(self, inputs):
        with torch.no_grad():
            out = self.model(*inputs.map(lambda t: t.double() if t.is_floating_point() else t).args)
        return map_tensors(out, lambda t: t.float())

    def close(self):
        self.model = None
        super().close()


@pytest.fixture
def float64_runtime(monkeypatch):
    """Float64Runtime registered as its own package would register it: an entry point in `parity.backends`."""
    _registered(monkeypatch, "parity.backends", "float64-runtime", f"{__name__}:Float64Runtime")
    plugins.BACKENDS.refresh()
    yield
    monkeypatch.undo()
    plugins.BACKENDS.refresh()


def test_a_third_party_backend_on_the_core_alone_gets_a_verdict_from_the_api_and_parity_check(float64_runtime,
                                                                                             tmp_path, capsys):
    model, x = tiny_cnn(), torch.randn(2, 3, 16, 16)
    check = assert_backends_agree(model, x, targets=["float64-runtime"], atol=1e-5, rtol=1e-5)["float64-runtime-cpu"]
    assert check.passed and check.status == "ok" and check.leaves
    code = main(["check", "tests.fixtures.tiny:tiny_cnn", "--target", "float64-runtime", "--input", "2x3x16x16",
                 "--out", str(tmp_path), "--quiet", "--no-report"])
    [record] = [r for r in map(json.loads, (tmp_path / "records.jsonl").read_text().splitlines())
                if r["kind"] == "check"]
    assert code == 0 and record["target"] == "float64-runtime-cpu" and record["passed"], capsys.readouterr()


def test_registering_a_class_that_is_not_a_backend_fails_parity_check_in_one_line(monkeypatch, tmp_path, capsys):
    _registered(monkeypatch, "parity.backends", "not-a-backend", "tests.fixtures.tiny:TinyCNN")
    plugins.BACKENDS.refresh()
    try:
        code = main(["check", "tests.fixtures.tiny:tiny_cnn", "--target", "not-a-backend", "--input", "2x3x16x16",
                     "--out", str(tmp_path), "--quiet", "--no-report"])
    finally:
        monkeypatch.undo()
        plugins.BACKENDS.refresh()
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    assert "not a subclass of parity.backends.base.Backend" in err, err
