"""int8 targets (`quantize:`): validation, ids and cache keys, calibration, tier 2's quantization-error ranking
and the fallback that keeps modules in float. The quantization error is constructed: a layer whose input has
one channel a thousand times the others', so its int8 input range loses what the others hold."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from parity.adapters.fallback import apply_fallback
from parity.backends.eager import EagerBackend
from parity.cli import main
from parity.config.schema import BackendSpec
from parity.config.tolerances import Tolerance
from parity.errors import ParityError
from parity.execute import calibration
from parity.execute.cache import ArtifactCache
from parity.execute.execution import execute
from parity.experiment import load_experiment
from parity.inputs import Inputs
from parity.records.view import RunView
from parity.runner.localization import localize
from parity.runner.search import candidates_from, search_fallback
from tests.fixtures.tiny import Sensitive
from tests.support import CHECK, localized, tiny_experiment

EAGER = BackendSpec(backend="eager")
PT2E = BackendSpec(backend="eager", quantize={"scheme": "pt2e-x86", "calibration": "calib"})
DYNAMIC = BackendSpec(backend="eager", quantize={"scheme": "torchao-int8-dynamic"})
IMAGE = Inputs((torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)),))
CALIB = Inputs((1.5 * torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)),))  # IMAGE's range


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def run_on(spec: BackendSpec, model: nn.Module, inputs: Inputs, calib: list[Inputs] | None = None, cls=EagerBackend):
    backend = cls(spec)
    backend.calibration = calib
    backend.prepare(model, inputs)
    try:
        return backend.run(inputs)
    finally:
        backend.close()


def problems_of(write_yaml, targets: list[dict], **overrides) -> list[str]:
    inputs = [{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}}, {"name": "calib", "synthetic": {"shape": [2, 3, 16, 16]}}]
    with pytest.raises(ParityError) as info:
        load_experiment(write_yaml(tiny_experiment(targets, inputs=inputs, **overrides)))
    return info.value.problems


@pytest.mark.parametrize("target, message", [
    ({"backend": "eager", "quantize": {"scheme": "int4", "calibration": "calib"}}, "quantize.scheme: Input should be 'pt2e-x86', "),
    ({"backend": "onnxruntime", "quantize": {"scheme": "pt2e-x86", "calibration": "calib"}},
     "backend 'onnxruntime' cannot run quantize scheme pt2e-x86 (it quantizes nothing)"),
    # subclasses of eager whose prepare does not quantize: the schemes eager declares are not theirs
    ({"backend": "torchscript", "quantize": {"scheme": "pt2e-x86", "calibration": "calib"}},
     "backend 'torchscript' cannot run quantize scheme pt2e-x86 (it quantizes nothing)"),
    ({"backend": "export", "quantize": {"scheme": "pt2e-x86", "calibration": "calib"}},
     "backend 'export' cannot run quantize scheme pt2e-x86 (it quantizes nothing)"),
    ({"backend": "compile", "quantize": {"scheme": "pt2e-xnnpack", "calibration": "calib"}},
     "backend 'compile' cannot run quantize scheme pt2e-xnnpack (it runs pt2e-x86, "),
    ({"backend": "eager", "quantize": {"scheme": "pt2e-x86", "calibration": "calibb"}},
     "no input set named 'calibb'; did you mean 'calib'? (defined: noise, calib)"),
    ({"backend": "eager", "quantize": {"scheme": "pt2e-x86"}}, "give `calibration: INPUT_SET`"),
    ({"backend": "eager", "quantize": {"scheme": "torchao-int8-weight", "calibration": "calib"}},
     "observes no data"),
    ({"backend": "eager", "dtype": "bfloat16", "quantize": {"scheme": "torchao-int8-weight"}},
     "starts from the float32 model on the CPU"),
])
def test_a_bad_quantize_key_is_one_line(write_yaml, target, message):
    problems = problems_of(write_yaml, [target])
    assert len(problems) == 1 and message in problems[0], problems
    assert "\n" not in problems[0]


def test_the_reference_is_never_quantized(write_yaml):
    problems = problems_of(write_yaml, [{"backend": "compile"}], reference=PT2E.model_dump())
    assert any("the reference is the float model" in p for p in problems)


def test_the_scheme_is_in_the_target_id_and_the_artifact_key(tmp_path):
    assert PT2E.id == "eager-cpu-int8-pt2e-x86" and DYNAMIC.id == "eager-cpu-int8-dynamic"
    assert BackendSpec(backend="compile", quantize={"scheme": "torchao-int8-weight"}).id == "compile-cpu-int8-weight"
    model, cache = Sensitive(), ArtifactCache(tmp_path)

    def key(spec, calib=None, float_set=()):
        backend = EagerBackend(spec)
        backend.calibration = calib
        return cache.key("graph", apply_fallback(model, list(float_set), spec) if float_set else model, backend,
                         IMAGE, "identity")

    keys = [key(EAGER), key(PT2E, [CALIB]), key(PT2E, [IMAGE]), key(PT2E, [CALIB], ["b"]), key(DYNAMIC)]
    assert None not in keys and len(set(keys)) == len(keys)


def test_a_calibrated_target_without_its_input_set_fails_rather_than_running_float():
    ran = execute(PT2E, Sensitive().eval(), IMAGE, 1)
    assert ran.status == "error" and "calibrates on input set 'calib'" in ran.error


def test_calibration_decides_the_activation_ranges():
    model, x = Mlp().eval(), Inputs((torch.randn(4, 16, generator=torch.Generator().manual_seed(0)),))
    on_data = run_on(PT2E, model, x, [Inputs((torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),))])
    on_zeros = run_on(PT2E, model, x, [Inputs((torch.zeros(4, 16),))])
    with torch.no_grad():
        float_out = model(*x.args)
    assert 0 < (on_data - float_out).abs().max() < 0.5 * (on_zeros - float_out).abs().max()


def test_an_int8_target_has_a_verdict_fails_a_tight_gate_and_is_offered_a_fallback(write_yaml, tmp_path, capsys):
    data = tiny_experiment([{**PT2E.model_dump(exclude_defaults=True), "tolerances": {"gate": 1e-6}}],
                           tolerances={"atol": [1e-6]},
                           inputs=[{"name": "noise", "synthetic": {"shape": [2, 3, 16, 16]}},
                                   {"name": "calib", "synthetic": {"shape": [2, 3, 16, 16]}}], tiers={"activations": True})
    data["models"][0].update(entry="tests.fixtures.tiny:Sensitive", inputs=["noise"])
    assert main(["run", str(write_yaml(data)), "--out", str(tmp_path / "run"), "--quiet", "--no-report"]) == 1
    printed = capsys.readouterr().out.replace("\n  ", " ")
    [check] = RunView.read(tmp_path / "run").checks(1)
    assert (check.target, check.passed, check.failure_class) == ("eager-cpu-int8-pt2e-x86", False, "numeric_drift")
    assert check.required_atol > 1e-4
    assert "diverges at b (Conv2d (" in printed and "parity reduce" not in printed  # an int8 culprit alone has no repro
    assert "next: parity fallback " in printed and "--target eager-cpu-int8-pt2e-x86" in printed
    assert main(["reduce", str(tmp_path / "run"), "--check", "tiny/noise/eager-cpu-int8-pt2e-x86", "--trust-records"]) == 2  # asked anyway: refused in one line, nothing written
    assert "is int8 (quantize: pt2e-x86)" in capsys.readouterr().err
    assert not list((tmp_path / "run").glob("reduce-*"))


def test_a_module_kept_in_float_computes_as_the_float_module():
    """torchao keeps the module tree: `b`, kept in float, maps whatever it is handed exactly as float `b`."""
    model, x = Mlp().eval(), Inputs((torch.randn(4, 16),))
    seen = {}
    kept = apply_fallback(model, ["b"], DYNAMIC)
    kept.b.register_forward_hook(lambda m, args, out: seen.update(b=(args[0].clone(), out.clone())))
    run_on(DYNAMIC, kept, x)
    given, out = seen["b"]
    with torch.inference_mode():
        assert torch.equal(out, model.b(given))
    quantized = apply_fallback(model, [], DYNAMIC)
    quantized.b.register_forward_hook(lambda m, args, out: seen.update(b=(args[0].clone(), out.clone())))
    run_on(DYNAMIC, quantized, x)
    given, out = seen["b"]
    with torch.inference_mode():
        assert not torch.equal(out, model.b(given))


def test_every_module_kept_in_float_gives_the_float_model():
    model = Sensitive().eval()
    out = run_on(PT2E, apply_fallback(model, ["a", "b", "head"], PT2E), IMAGE, [CALIB])
    with torch.no_grad():
        assert torch.equal(out, model(*IMAGE.args))


@pytest.fixture(scope="module")
def ranked():
    model = Sensitive().eval()
    with calibration.providing(lambda name: [CALIB]):
        return model, localize(EAGER, PT2E, model, IMAGE, 1e-5, 1e-3, granularity="leaf")


def test_tier2_ranks_layers_by_their_own_quantization_error(ranked):
    _, loc = ranked
    errors = {name: e.rel_rmse for name, e in loc.levels[0][1].local.items()}
    assert loc.culprit == "b" and errors["b"] > 10 * max(errors["a"], errors["head"]) > 0
    assert loc.levels[0][1].propagated == {}  # not measured: the int8 graph has no module hooks


def test_fallback_keeps_the_sensitive_layer_in_float(ranked):
    model, loc = ranked
    with calibration.providing(lambda name: [CALIB]):
        result = search_fallback(EAGER, PT2E, model, IMAGE, candidates_from(localized(loc)), Tolerance((0.05,), 1e-5, 0.05),
                                 latency_runs=2, names=CHECK)
    assert result.runs_in == "float" and result.required_atol_before > 0.05
    assert result.passed and result.modules == ["b"] and result.required_atol_after <= 0.05
    assert result.latency_before_s > 0 and result.latency_after_s > 0


def test_executorch_runs_the_int8_program_not_the_float_one():
    """An ExecuTorch pt2e-xnnpack target (the quantized graph exported again and lowered to XNNPACK's int8 kernels)
    is far from the float model and close to eager's pt2e-xnnpack graph, the reference numerics of that program."""
    pytest.importorskip("executorch")
    from parity.backends.executorch import ExecuTorchBackend

    model, x, calib = Mlp().eval(), Inputs((torch.randn(8, 16),)), [Inputs((torch.randn(8, 16),))]
    spec = BackendSpec(backend="executorch", quantize={"scheme": "pt2e-xnnpack", "calibration": "calib"})
    backend = ExecuTorchBackend(spec)
    backend.calibration = calib
    backend.prepare(copy.deepcopy(model), x)
    try:
        deployed = backend.run(x)
    finally:
        backend.close()
    reference_int8 = run_on(BackendSpec(backend="eager", quantize=spec.quantize), copy.deepcopy(model), x, calib)
    with torch.no_grad():
        float_out = model(*x.args)
    quantization_error = float((deployed - float_out).abs().max())
    assert quantization_error > 1e-3
    assert float((deployed - reference_int8).abs().max()) < 0.5 * quantization_error


def test_executorch_runs_torchao_int8_weight_only_linears():
    """A weight-only ExecuTorch target (torchao's linears exported, lowered with the portable kernels) is far from
    the float model and close to eager's torchao model, the reference numerics of that program."""
    pytest.importorskip("executorch")
    pytest.importorskip("torchao")
    from parity.backends.executorch import ExecuTorchBackend

    model, x = Mlp().eval(), Inputs((torch.randn(8, 16),))
    spec = BackendSpec(backend="executorch", options={"delegate": "none"}, quantize={"scheme": "torchao-int8-weight"})
    deployed = run_on(spec, copy.deepcopy(model), x, [], ExecuTorchBackend)
    eager_quantized = run_on(BackendSpec(backend="eager", quantize=spec.quantize), copy.deepcopy(model), x, [])
    with torch.no_grad():
        quantization_error = float((eager_quantized - model(*x.args)).abs().max())
    assert quantization_error > 1e-4
    assert float((deployed - eager_quantized).abs().max()) < 0.1 * quantization_error


def test_executorch_refuses_int4_weight_only_in_one_line(write_yaml):
    problems = problems_of(write_yaml, [{"backend": "executorch", "quantize": {"scheme": "torchao-int4-weight"}}])
    assert len(problems) == 1 and problems[0].endswith(
        "targets[0].quantize.scheme: backend 'executorch' cannot run quantize scheme torchao-int4-weight "
        "(it runs pt2e-xnnpack, torchao-int8-weight)")


def test_executorch_int8_needs_its_xnnpack_delegate(write_yaml):
    problems = problems_of(write_yaml, [{"backend": "executorch", "options": {"delegate": "none"},
                                         "quantize": {"scheme": "pt2e-xnnpack", "calibration": "calib"}}])
    assert len(problems) == 1 and "ExecuTorch runs int8 through its XNNPACK delegate" in problems[0]


def count_experiment(write_yaml, entry: str):
    """CountClassifier (tests/fixtures/tiny.py) on 8 binary 4x4 images, calibrated on 8 uniform in [0, 1] (the
    same range; an observer's range search on two values is slow): int8 flips every decision of class 0 (5 of
    8), and only its layer `b` is to blame; tier 3 asks for every decision."""
    shape = [8, 3, 4, 4]
    data = tiny_experiment([PT2E.model_dump(exclude_defaults=True)], tolerances={"atol": [1e-3], "gate": 1e-3},
                           inputs=[{"name": "images", "synthetic": {"shape": shape, "distribution": "randint",
                                                                    "low": 0.0, "high": 2.0, "seed": 0}},
                                   {"name": "calib", "synthetic": {"shape": shape, "distribution": "uniform", "seed": 1}}],
                           tiers={"tasks": {"classification": {"top1_agreement": 1.0}}})
    data["models"][0].update(entry=entry, inputs=["images"], task="classification")
    return write_yaml(data)


def test_a_tier3_fallback_keeps_the_flipping_layer_in_float_and_times_int8_against_float(write_yaml, tmp_path, capsys):
    path = count_experiment(write_yaml, "tests.fixtures.tiny:CountClassifier")
    assert main(["fallback", str(path), "--tier", "3", "--out", str(tmp_path / "out")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    [record] = RunView.read(tmp_path / "out").fallbacks
    assert record.aim == "tier 3" and record.runs_in == "float"
    assert record.task_before["top1_flips"] == 5 and record.task_after["top1_flips"] == 0
    assert record.passed and record.modules == ["b"] and not record.whole_model
    assert record.tried == 2  # the ceiling, then [b] alone: no shrink trial of the empty set, which ran first and failed
    assert all(getattr(record, k) > 0 for k in ("latency_before_s", "latency_after_s", "latency_float_s"))
    assert "fallback: [b]; median latency" in printed and "the float model on the same backend: " in printed
    assert "apply it: in the target's entry, fallback: [tiny:b]" in printed


def test_a_tier3_fallback_that_no_module_set_restores_fails(write_yaml, tmp_path, capsys):
    """The flipping conv is the model's own `F.conv2d`, inside no module: every module in float still flips
    the same decisions, and the command says no set passes, exits 1 and offers no set to apply."""
    path = count_experiment(write_yaml, "tests.fixtures.tiny:count_classifier_functional")
    assert main(["fallback", str(path), "--tier", "3", "--out", str(tmp_path / "out")]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    [record] = RunView.read(tmp_path / "out").fallbacks
    assert not record.passed and record.task_after["top1_flips"] == 5 and set(record.modules) == {"a", "head"}
    assert record.latency_float_s is None
    assert record.tried == 1 and record.ceiling_modules == 2  # every candidate in float at once: the ceiling failed
    assert ("no fallback can pass: with all 2 candidate module(s) in float at once, the classification decisions "
            "still disagree") in printed and "apply it" not in printed
    assert "lower the thresholds in tiers.tasks" in printed and "next: lower" not in printed


def test_executorch_int8_keeps_a_fallback_module_in_float():
    """ExecuTorch's pt2e-xnnpack with `a` and `b` kept in float (XNNPACKQuantizer refuses `set_module_name(name,
    None)`; a filter function declines their nodes): the deployed program agrees with the float model on every
    decision that int8 flips (CountClassifier). Both: XNNPACK quantizes `a`'s output too, where the copies of
    channel 0 lose their pixels before `b` sees them."""
    pytest.importorskip("executorch")
    from parity.backends.executorch import ExecuTorchBackend
    from tests.fixtures.tiny import CountClassifier

    spec = BackendSpec(backend="executorch", quantize={"scheme": "pt2e-xnnpack", "calibration": "calib"})
    model = CountClassifier().eval()
    x = Inputs((torch.randint(0, 2, (8, 3, 4, 4), generator=torch.Generator().manual_seed(0)).float(),))
    calib = [Inputs((torch.rand(8, 3, 4, 4, generator=torch.Generator().manual_seed(1)),))]

    def decisions(kept: list[str]) -> list[int]:
        backend = ExecuTorchBackend(spec)
        backend.calibration = calib
        backend.prepare(apply_fallback(model, kept, spec), x)
        try:
            return backend.run(x).argmax(1).tolist()
        finally:
            backend.close()

    with torch.no_grad():
        expected = model(*x.args).argmax(1).tolist()
    # int8 (eager's pt2e-xnnpack graph, the reference numerics of the deployed one; no lowering): no pixel on, class 1
    int8 = run_on(BackendSpec(backend="eager", quantize=spec.quantize), copy.deepcopy(model), x, calib)
    assert expected.count(0) == 5 and int8.argmax(1).tolist() == [1] * 8
    assert decisions(["a", "b"]) == expected


def test_the_trained_int8_example_is_valid(tmp_path, capsys):
    """examples/int8_trained.yaml reads what `make int8-demo`'s training writes under parity-out/ (not in a
    clone): valid with stand-ins for those files, beside a copy of the example."""
    from PIL import Image

    from tests.support import ROOT

    (tmp_path / "examples").mkdir()
    example = tmp_path / "examples" / "int8_trained.yaml"
    example.write_text((ROOT / "examples" / "int8_trained.yaml").read_text())
    digits = tmp_path / "parity-out" / "digits"
    for folder in ("heldout", "calibration"):
        (digits / folder).mkdir(parents=True)
        Image.new("L", (32, 32)).save(digits / folder / "0000.png")
    torch.save({}, digits / "resnet18_digits.pt")
    assert main(["validate", str(example)]) == 0
    assert "valid" in capsys.readouterr().out


def test_int4_keeps_a_linear_it_cannot_group_in_float_and_says_so():
    """`Linear(16, 32)` has 16 input features, no multiple of int4's group of 32 (torchao raised an AssertionError
    on it): it stays float and the execution's notes name it; `Linear(32, 4)` is int4. A model where no linear
    groups is refused in one line rather than run as float under an int4 id."""
    int4 = BackendSpec(backend="eager", quantize={"scheme": "torchao-int4-weight"})
    model, x = Mlp().eval(), Inputs((torch.randn(4, 16, generator=torch.Generator().manual_seed(2)),))
    backend = EagerBackend(int4)
    backend.prepare(copy.deepcopy(model), x)  # quantize_ works in place
    try:
        out = backend.run(x)
    finally:
        backend.close()
    assert backend.notes == ({"kind": "quantize", "message": "int4 weight-only: 1 linear layer(s) kept in float, their "
                                                             "input features not a multiple of the group size 32: a"},)
    with torch.no_grad():
        assert not torch.equal(out, model(*x.args))  # b is int4
    ungroupable = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with pytest.raises(ValueError, match="none of this model's 2 has a multiple of 32: nothing would be int4"):
        run_on(int4, ungroupable, x)
