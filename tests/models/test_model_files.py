"""Model files as models: `source: onnx` (the graph, run as ONNX Runtime CPU float32 by the reference and read
from the file by onnxruntime, openvino and onnx2torch), `source: torchscript` (.pt) and `source: exported`
(.pt2). The files are the examples' tiny ones (examples/models/make_tiny.py); a perturbation is constructed by
a test backend that shifts ONNX Runtime's outputs by an exact offset."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch
from pydantic import Field

from parity.api import run_experiment
from parity.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeOptions
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.models import build_model, source_fingerprint
from parity.runner.runner import Runner

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
ONNX, SCRIPT, EXPORTED = MODELS / "tiny_cnn.onnx", MODELS / "tiny_cnn.pt", MODELS / "tiny_cnn.pt2"
NOISE = {"name": "noise", "synthetic": {"x": {"shape": [2, 3, 16, 16]}}}
SHIFT = 1e-3


class ShiftOptions(OnnxRuntimeOptions):
    shift: float = Field(default=0.0)


class Shifted(OnnxRuntimeBackend):
    """ONNX Runtime with every output moved by `shift`: a difference of exactly that size."""

    Options = ShiftOptions

    def run(self, inputs):
        return {k: v + self.options.shift for k, v in super().run(inputs).items()}


def _data(models: list[dict], targets: list[dict], **overrides) -> dict:
    return {"name": "files", "seed": 0, "models": models, "inputs": [NOISE], "targets": targets, **overrides}


def _onnx(**extra) -> dict:
    return {"name": "graph", "source": "onnx", "path": str(ONNX), **extra}


def _checks(records: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["model"], r["target"]): r for r in records if r.get("kind") == "check" and r.get("tier") == 1}


@pytest.fixture(scope="module")
def onnx_run(tmp_path_factory):
    """One run of the ONNX file: reference ONNX Runtime CPU float32; ONNX Runtime without graph optimizations,
    onnx2torch, OpenVINO, and the shifted target judged at a tight and at a loose gate."""
    shifted = f"{__name__}:Shifted"
    targets = [{"backend": "onnxruntime", "name": "ort-disable", "options": {"graph_optimization_level": "disable"}},
               {"backend": "onnx2torch"},
               {"backend": "openvino"},
               {"backend": shifted, "name": "shift-tight", "options": {"shift": SHIFT}, "tolerances": {"gate": 1e-4}},
               {"backend": shifted, "name": "shift-loose", "options": {"shift": SHIFT}, "tolerances": {"gate": 1e-2}}]
    return _checks(run_experiment(_data([_onnx()], targets), tmp_path_factory.mktemp("onnx"), reports=()))


def test_an_onnx_file_runs_on_the_backends_that_read_it_and_gets_a_verdict(onnx_run):
    for target in ("ort-disable", "onnx2torch-cpu", "openvino-cpu"):
        check = onnx_run[("graph", target)]
        assert check["status"] == "ok" and check["passed"] is True, check
    assert [leaf["name"] for leaf in onnx_run[("graph", "ort-disable")]["leaves"]] == ["out['logits']"]  # by output name


def test_a_constructed_offset_on_an_onnx_file_fails_a_tight_gate_and_passes_a_loose_one(onnx_run):
    tight, loose = onnx_run[("graph", "shift-tight")], onnx_run[("graph", "shift-loose")]
    assert tight["passed"] is False and tight["failure_class"] == "numeric_drift"
    assert loose["passed"] is True
    assert tight["required_atol"] == pytest.approx(SHIFT, rel=1e-3)


def test_torchscript_and_exported_files_run_against_eager_with_a_verdict(tmp_path):
    models = [{"name": "scripted", "source": "torchscript", "path": str(SCRIPT)},
              {"name": "exported", "source": "exported", "path": str(EXPORTED)}]
    targets = [{"backend": "onnxruntime", "options": {"exporter": "torchscript"}}]
    data = _data(models, targets, inputs=[{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}])
    checks = _checks(run_experiment(data, tmp_path, reports=()))
    for model in ("scripted", "exported"):
        check = checks[(model, "onnxruntime-cpu")]
        assert check["status"] == "ok" and check["passed"] is True, check


def test_each_file_source_builds_the_same_function():
    """The three files are one TinyCNN: the same inputs give the same logits (to float32 rounding)."""
    data = _data([_onnx(), {"name": "s", "source": "torchscript", "path": str(SCRIPT)},
                  {"name": "e", "source": "exported", "path": str(EXPORTED)}], [{"backend": "openvino"}])
    exp = experiment_from_dict(data)
    x = torch.randn(2, 3, 16, 16)
    graph, scripted, exported = (build_model(m, exp) for m in exp.models)
    logits = graph(x=x)["logits"]
    assert torch.allclose(scripted(x), logits, atol=1e-6) and torch.allclose(exported(x), logits, atol=1e-6)


@pytest.mark.parametrize("target, message", [
    ({"backend": "compile"}, "backend 'compile' cannot run an ONNX graph file (model 'graph'; backends that run an "
                             "ONNX graph file: eager, onnx2torch, onnxruntime, onnxruntime-tensorrt, openvino)"),
    ({"backend": "torchscript"}, "backend 'torchscript' cannot run an ONNX graph file"),
    ({"backend": "eager", "dtype": "bfloat16"}, "runs an ONNX graph file as ONNX Runtime CPU float32, without options"),
    ({"backend": "onnxruntime", "options": {"exporter": "torchscript"}}, "options exporter do not apply"),
])
def test_a_backend_that_cannot_run_an_onnx_file_is_refused_at_validation(target, message):
    with pytest.raises(ParityError) as exc:
        experiment_from_dict(_data([_onnx()], [target]))
    assert len(exc.value.problems) == 1 and "targets[0]" in exc.value.problems[0]
    assert message in exc.value.problems[0]


@pytest.mark.parametrize("overrides, where, message", [
    ({"oracle": True}, "oracle", "not cpu float64"),
    ({"tiers": {"activations": True}}, "tiers.activations", "an ONNX graph file, whose layers run none"),
])
def test_the_oracle_and_tier_2_are_refused_for_an_onnx_file(overrides, where, message):
    with pytest.raises(ParityError) as exc:
        experiment_from_dict(_data([_onnx()], [{"backend": "onnxruntime"}], **overrides))
    [problem] = exc.value.problems
    assert where in problem and message in problem


@pytest.mark.parametrize("target, message", [
    ({"backend": "onnxruntime"}, "set options.exporter: torchscript"),
    ({"backend": "compile"}, "backend 'compile' cannot run a TorchScript module (.pt)"),
    ({"backend": "onnx2torch"}, "backend 'onnx2torch' cannot run a TorchScript module (.pt)"),
])
def test_a_backend_that_cannot_run_a_torchscript_file_is_refused_at_validation(target, message):
    data = _data([{"name": "s", "source": "torchscript", "path": str(SCRIPT)}], [target],
                 inputs=[{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}])
    with pytest.raises(ParityError) as exc:
        experiment_from_dict(data)
    [problem] = exc.value.problems
    assert message in problem


@pytest.mark.parametrize("synthetic, message", [
    ({"y": {"shape": [2, 3, 16, 16]}}, "input set 'noise' names y; the ONNX graph's inputs are x: float32[2, 3, 16, 16]"),
    ({"x": {"shape": [2, 3, 16, 15]}}, "input set 'noise': x is float32[2, 3, 16, 15]; the ONNX graph's inputs"),
    ([{"shape": [2, 3, 16, 16]}, {"shape": [2]}], "input set 'noise' gives 2 tensor(s)"),
    ({"x": {"shape": [2, 3, 16, 16], "dtype": "float64"}}, "x is float64[2, 3, 16, 16]"),
])
def test_input_sets_that_do_not_fit_the_onnx_graph_are_one_line_at_validation(synthetic, message):
    with pytest.raises(ParityError) as exc:
        experiment_from_dict(_data([_onnx()], [{"backend": "onnxruntime"}],
                                   inputs=[{"name": "noise", "synthetic": synthetic}]))
    [problem] = exc.value.problems
    assert "models[0].inputs" in problem and message in problem


def _corrupt(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(b"not a model file\n" * 4)
    return path


@pytest.mark.parametrize("source, name, message", [
    ("onnx", "missing.onnx", "ONNX file not found"),
    ("onnx", "model.pt", "expected a .onnx file, not '.pt'"),
    ("torchscript", "model.onnx", "expected a .pt or .pth or .ts file, not '.onnx'"),
    ("exported", "missing.pt2", "torch.export file not found"),
    ("onnx", "corrupt.onnx", "is not an ONNX model the onnx package can read"),
])
def test_a_missing_misnamed_or_corrupt_file_is_one_line_at_validate_exit_2(tmp_path, write_yaml, capsys, source, name,
                                                                          message):
    if name.startswith("corrupt") or name == "model.pt" or name == "model.onnx":
        _corrupt(tmp_path, name)
    path = write_yaml(_data([{"name": "m", "source": source, "path": name}], [{"backend": "openvino"}],
                            inputs=[{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}]))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "models[0].path" in err[0] and message in err[0], err


@pytest.mark.parametrize("source, name", [("torchscript", "corrupt.pt"), ("exported", "corrupt.pt2")])
def test_a_corrupt_saved_file_is_one_line_exit_2_when_the_run_loads_it(tmp_path, write_yaml, capsys, source, name):
    _corrupt(tmp_path, name)
    path = write_yaml(_data([{"name": "m", "source": source, "path": name}], [{"backend": "openvino"}],
                            inputs=[{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}]))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"is not a {'TorchScript' if source == 'torchscript' else 'torch.export'} file" in err[0], err


def test_a_file_source_takes_no_weights_init_or_params():
    for extra, key in (({"weights": "w.safetensors"}, "weights"), ({"init": "fan_in"}, "init"), ({"params": {"a": 1}}, "params"), ({"seed": 3}, "seed")):
        with pytest.raises(ParityError, match=f"'{key}'"):
            experiment_from_dict(_data([_onnx(**extra)], [{"backend": "onnxruntime"}]))


def test_the_onnx_model_feeds_by_name_and_copies_without_its_session():
    exp = experiment_from_dict(_data([_onnx()], [{"backend": "onnxruntime"}]))
    graph = build_model(exp.models[0], exp)
    x = torch.randn(2, 3, 16, 16)
    first = graph(x)["logits"]  # positional: in the graph's order
    assert graph._session is not None and copy.deepcopy(graph)._session is None
    assert pickle.loads(pickle.dumps(graph))._session is None
    assert torch.equal(copy.deepcopy(graph)(x=x)["logits"], first)
    with pytest.raises(RuntimeError, match="the ONNX graph's inputs are x; unknown or repeated: y"):
        graph(y=x)
    with pytest.raises(RuntimeError, match="missing: x"):
        graph()


def test_a_file_models_cache_identity_is_its_bytes(tmp_path):
    for source, original in (("onnx", ONNX), ("torchscript", SCRIPT)):
        path = tmp_path / original.name
        path.write_bytes(original.read_bytes())
        exp = experiment_from_dict(_data([{"name": "m", "source": source, "path": str(path)}], [{"backend": "openvino"}],
                                         inputs=[NOISE] if source == "onnx" else [{"name": "n", "synthetic": {"shape": [1]}}]))
        before = source_fingerprint(exp.models[0], exp)
        if source == "onnx":  # still a valid graph: the digest reads it (for external data) before the bytes
            import onnx

            proto = onnx.load(str(path))
            proto.doc_string = "edited"
            onnx.save(proto, str(path))
        else:
            path.write_bytes(original.read_bytes() + b"\0")
        assert source_fingerprint(exp.models[0], exp)["files"] != before["files"]


def test_localize_and_fallback_refuse_a_file_model():
    runner = Runner(experiment_from_dict(_data([_onnx()], [{"backend": "onnxruntime"}])))
    with pytest.raises(ParityError, match="'graph' is an ONNX graph file, whose layers run no module hooks"):
        runner.one_check()


def test_the_onnxruntime_repro_follows_the_exporter_and_the_optimization_level():
    spec = BackendSpec(backend="onnxruntime", options={"exporter": "torchscript", "graph_optimization_level": "basic"})
    snippet = OnnxRuntimeBackend.repro_snippet(spec)
    assert "dynamo=False" in snippet and "GraphOptimizationLevel.ORT_ENABLE_BASIC" in snippet
    default = OnnxRuntimeBackend.repro_snippet(BackendSpec(backend="onnxruntime"))
    assert "dynamo=True" in default and "GraphOptimizationLevel.ORT_ENABLE_ALL" in default


def test_the_torchscript_exporter_refuses_dynamic_shapes():
    with pytest.raises(ParityError, match="the TorchScript exporter exports the example's shapes"):
        experiment_from_dict(_data([{"name": "tiny", "source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}],
                                   [{"backend": "onnxruntime", "options": {"exporter": "torchscript", "dynamic": True}}],
                                   inputs=[{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}]))


def test_the_onnxruntime_session_of_an_onnx_file_has_the_targets_optimization_level():
    import onnxruntime as ort

    exp = experiment_from_dict(_data([_onnx()], [{"backend": "onnxruntime"}]))
    graph = build_model(exp.models[0], exp)
    for level, expected in (("disable", "ORT_DISABLE_ALL"), ("basic", "ORT_ENABLE_BASIC")):
        backend = OnnxRuntimeBackend(BackendSpec(backend="onnxruntime", options={"graph_optimization_level": level}))
        backend.prepare(copy.deepcopy(graph), None)
        assert backend.session.get_session_options().graph_optimization_level == getattr(ort.GraphOptimizationLevel, expected)
        assert backend.session._model_path == str(ONNX)  # the file itself, not an export of the wrapper
        backend.close()


def test_the_torchscript_exporter_says_why_tier_2_cannot_see_its_layers():
    backend = OnnxRuntimeBackend(BackendSpec(backend="onnxruntime", options={"exporter": "torchscript"}))
    found = backend.capture_layers(torch.nn.Linear(2, 2), None, ["a", "b"])
    assert found == dict.fromkeys(["a", "b"], "the TorchScript exporter keeps no module scopes in the graph "
                                              "(exporter: dynamo does)")


def test_a_two_input_graph_takes_its_inputs_by_name_in_any_order(tmp_path):
    """d = a - b, made with onnx.helper: keyword inputs go by the graph's names, positional ones by its order."""
    import onnx
    from onnx import TensorProto, helper

    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Sub", ["a", "b"], ["d"])], "sub", [value("a"), value("b")], [value("d")])
    path = tmp_path / "sub.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    data = _data([{"name": "sub", "source": "onnx", "path": str(path)}], [{"backend": "onnxruntime"}],
                 inputs=[{"name": "pair", "synthetic": {"b": {"shape": [2]}, "a": {"shape": [2]}}}])
    exp = experiment_from_dict(data)
    model = build_model(exp.models[0], exp)
    a, b = torch.tensor([5.0, 7.0]), torch.tensor([1.0, 2.0])
    assert torch.equal(model(b=b, a=a)["d"], a - b) and torch.equal(model(a, b)["d"], a - b)


def test_onnxruntime_targets_that_differ_only_in_session_options_share_one_export(tmp_path):
    from parity.execute.cache import ArtifactCache
    from parity.inputs import Inputs
    from tests.fixtures.tiny import tiny_cnn

    cache, model, example = ArtifactCache(tmp_path), tiny_cnn(), Inputs((torch.randn(1, 3, 8, 8),))

    def key(**options):
        return cache.key("onnx", model, OnnxRuntimeBackend(BackendSpec(backend="onnxruntime", options=options)),
                         example, "identity")

    assert key() == key(graph_optimization_level="disable", threads=1)
    assert key() != key(exporter="torchscript") and key() != key(opset=17)


def test_the_reference_feeds_an_onnx_graph_its_own_input_dtypes(tmp_path):
    """A float64 input reaches the graph as float64 from eager, as from every backend that reads the file:
    eager's float32 cast would hand the reference another input than the targets get."""
    import onnx
    from onnx import TensorProto, helper

    from parity.backends.eager import EagerBackend
    from parity.inputs import Inputs

    value = lambda name: helper.make_tensor_value_info(name, TensorProto.DOUBLE, [3])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "same", [value("a")], [value("b")])
    path = tmp_path / "same.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    data = _data([{"name": "same", "source": "onnx", "path": str(path)}], [{"backend": "onnxruntime"}],
                 inputs=[{"name": "wide", "synthetic": {"a": {"shape": [3], "dtype": "float64"}}}])
    exp = experiment_from_dict(data)
    a = torch.tensor([1 / 3, 2 / 3, 1e-300], dtype=torch.float64)  # none is a float32 value
    backend = EagerBackend(exp.reference)
    backend.prepare(build_model(exp.models[0], exp), Inputs(kwargs={"a": a}))
    assert torch.equal(backend.run(Inputs(kwargs={"a": a}))["b"], a)
