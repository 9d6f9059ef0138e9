"""The Python API for users' own tests."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from parity import ParityError, assert_backends_agree, run_experiment
from parity.records import read_records
from tests.fixtures.tiny import Structured, TinyCNN
from tests.support import tiny_experiment


def model_and_input():
    torch.manual_seed(0)
    return TinyCNN().eval(), torch.randn(2, 3, 12, 12)


@pytest.mark.numerics
def test_agreeing_backends_pass_and_the_model_is_untouched():
    model, x = model_and_input()
    before = copy.deepcopy(model.state_dict())
    assert_backends_agree(model, x, targets=["torchscript", "onnxruntime", {"backend": "eager", "dtype": "float64"}],
                          atol=1e-5, rtol=1e-5)
    assert all(torch.equal(v, before[k]) and v.dtype == before[k].dtype for k, v in model.state_dict().items())
    assert model.conv.weight.dtype == torch.float32


def test_disagreement_reads_like_assert_close():
    model, x = model_and_input()
    with pytest.raises(AssertionError) as info:
        assert_backends_agree(model, x, targets=[{"backend": "eager", "dtype": "bfloat16"}], atol=1e-6, rtol=1e-6)
    message = str(info.value)
    assert "Target eager-cpu-bfloat16 does not match reference eager-cpu (numeric_drift)" in message
    assert "out: Mismatched elements:" in message and "/ 10 (" in message
    assert "Greatest absolute difference:" in message and "Greatest relative difference:" in message


def test_structure_problems_are_reported_by_leaf():
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="did not run|unsupported_op"):
        assert_backends_agree(Structured(True).eval(), torch.randn(3, 4), targets=["onnxruntime"])


def test_bad_targets_are_user_errors_before_anything_runs():
    model, x = model_and_input()
    with pytest.raises(ParityError) as info:
        assert_backends_agree(model, x, targets=["onnxruntim", {"backend": "compile", "options": {"mod": "default"}}])
    assert "targets[0]: unknown target 'onnxruntim': no backend 'onnxruntim'; did you mean 'onnxruntime'?" in info.value.problems[0]
    assert "targets[1].options.mod: unknown option for backend 'compile'; did you mean 'mode'?" in info.value.problems[1]


def test_run_experiment_from_a_dict(tmp_path):
    records = run_experiment(tiny_experiment([{"backend": "torchscript"}]), out=tmp_path)
    assert [r["kind"] for r in records].count("check") == 1
    assert (tmp_path / "report.md").exists() and (tmp_path / "summary.json").exists()



def test_run_experiment_returns_the_verdict_parity_run_gives(tmp_path):
    result = run_experiment(tiny_experiment([{"backend": "eager", "name": "same"},
                                             {"backend": "tests.fixtures.tiny:PerturbedEager", "name": "nudged"}]),
                            out=tmp_path, reports=())
    assert not result.passed and result.exit_code == 1 and result.complete and result.missing == []
    assert [(c.target, c.passed) for c in result.checks] == [("same", True), ("nudged", False)]
    [failure] = result.failures
    assert failure.target == "nudged" and failure.required_atol > 0 and failure.failure_class == "numeric_drift"
    assert result.summary.totals.failed == 1
    assert result == read_records(tmp_path) and result.records == read_records(tmp_path)  # still the records


def test_an_api_run_that_lost_a_check_is_not_passed(tmp_path, monkeypatch):
    """The Runner's own guard: were it to skip a target (a bug; constructed here by a job that drops its
    second target), the run's result is not passed and its exit code is 3, whichever front end reads it."""
    from parity.runner import runner as local

    run_job = local._run_job

    def loses_a_target(job, *args, **kwargs):
        return run_job(job.__class__(job.model, job.inputs, job.reference, job.oracle, job.targets[:1], job.repeats),
                       *args, **kwargs)

    monkeypatch.setattr(local, "_run_job", loses_a_target)
    result = run_experiment(tiny_experiment([{"backend": "eager", "name": "same"}, {"backend": "eager", "name": "second"}]),
                            out=tmp_path, reports=())
    assert [c.passed for c in result.checks] == [True]  # every verdict it has passes
    assert not result.passed and result.exit_code == 3 and result.missing == [("tiny", "noise", "second")]


def test_an_api_run_whose_summary_was_not_written_is_not_passed(tmp_path, monkeypatch):
    from parity.runner import runner as local

    monkeypatch.setattr(local, "write_summary", lambda summary, path: None)
    result = run_experiment(tiny_experiment([{"backend": "eager", "name": "same"}]), out=tmp_path, reports=())
    assert result.missing == [] and not result.passed and result.exit_code == 3


class Counts(torch.nn.Module):
    """Integer outputs: the input scaled by 100, rounded. In bfloat16 some counts move by one or two."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(100.0))

    def forward(self, x):
        return (x * self.scale).round().to(torch.int64)


def test_integer_outputs_are_said_to_be_compared_exactly():
    """atol 5 would allow what the integers differ by, but integers are compared exactly: the message must
    not say that a difference is allowed."""
    x = torch.randn(2, 6, generator=torch.Generator().manual_seed(0))
    with pytest.raises(AssertionError) as info:
        assert_backends_agree(Counts(), x, targets=[{"backend": "eager", "dtype": "bfloat16"}], atol=5, rtol=0.1)
    message = str(info.value)
    assert "int64 compared exactly (atol and rtol do not apply)" in message
    assert re.search(r"Greatest absolute difference: [1-4] \(none allowed\)", message)
    assert "allowed" not in message.replace("(none allowed)", "")


def test_which_leaves_are_compared_exactly():
    from parity.records.models import Leaf
    from parity.verify.tensors import compared_exactly

    assert compared_exactly(Leaf(name="out", dtype="int64")) and compared_exactly(Leaf(name="out", dtype="bool"))
    assert not compared_exactly(Leaf(name="out", dtype="float32")) and not compared_exactly(Leaf(name="out", dtype="bfloat16"))
    assert not compared_exactly(Leaf(name="out", dtype="complex64")) and not compared_exactly(Leaf(name="out"))
    assert not compared_exactly(Leaf(name="out", dtype="int32", reference_dtype="int64"))  # a mismatch, not exact


def test_success_returns_the_numbers_per_target_and_leaf():
    model, x = model_and_input()
    result = assert_backends_agree(model, x, targets=["torchscript", "eager:float64"], atol=1e-5, rtol=1e-5)
    assert result.passed and list(result.targets) == ["torchscript-cpu", "eager-cpu-float64"]
    leaf = result["eager-cpu-float64"].leaves[0]
    assert leaf["name"] == "out" and leaf["shape"] == [2, 5] and 0 < leaf["max_abs"] < 1e-5
    assert result["eager-cpu-float64"].required_atol == pytest.approx(max(0.0, leaf["required_atol"]))
    assert result["torchscript-cpu"].max_abs == 0.0 and result.reference == "eager-cpu"


def test_the_assertion_error_carries_the_result():
    model, x = model_and_input()
    with pytest.raises(AssertionError) as info:
        assert_backends_agree(model, x, targets=["eager", "eager-cpu-bfloat16"], atol=1e-6, rtol=1e-6,
                              reference="eager:float64")
    result = info.value.result
    assert not result.passed and result["eager-cpu"].passed
    bad = result["eager-cpu-bfloat16"]
    assert bad.failure_class == "numeric_drift" and bad.required_atol > 1e-6 and bad.leaves[0]["failure_class"]


def test_target_ids_are_the_ids_the_tables_print():
    model, x = model_and_input()
    result = assert_backends_agree(model, x, targets=["eager-cpu-float64", "tests.fixtures.tiny:NoisyEager"],
                                   reference="eager-cpu")
    assert list(result.targets) == ["eager-cpu-float64", "NoisyEager-cpu"]
    with pytest.raises(ParityError, match="unknown target 'eager-cpu-bfloat61'.*did you mean 'bfloat16'"):
        assert_backends_agree(model, x, targets=["eager-cpu-bfloat61"])
    with pytest.raises(ParityError, match="target id 'eager-cpu-float64' appears twice"):
        assert_backends_agree(model, x, targets=["eager:float64", "eager-fp64"])


class Counting(torch.nn.Module):
    """Counts its forwards: the reference cache is tested by how often the reference ran."""

    calls = 0

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.scale = scale

    def forward(self, x):
        Counting.calls += 1
        return self.lin(x) * self.scale


def test_the_reference_cache_runs_the_reference_once_per_model_and_inputs():
    cache: dict = {}
    x = torch.randn(2, 4)
    torch.manual_seed(0)
    model = Counting()
    Counting.calls = 0
    for target in ("torchscript", "eager:float64"):  # each call builds its model afresh, as a test would
        torch.manual_seed(0)
        assert_backends_agree(Counting(), x, targets=[target], reference_cache=cache)
    after_two = Counting.calls
    assert_backends_agree(model, x, targets=["eager"], reference_cache=cache)
    assert Counting.calls - after_two == 1  # the target ran; the reference came from the cache
    assert len(cache) == 1


def test_the_reference_cache_never_serves_another_models_outputs():
    cache: dict = {}
    x = torch.randn(2, 4)
    torch.manual_seed(0)
    one = Counting()
    other_weights, other_setting = copy.deepcopy(one), copy.deepcopy(one)
    with torch.no_grad():
        other_weights.lin.bias[0] += 1.0
    other_setting.scale = 2.0
    assert_backends_agree(one, x, targets=["eager"], reference_cache=cache)
    for changed in (other_weights, other_setting):
        assert assert_backends_agree(changed, x, targets=["eager"], reference_cache=cache).passed
    assert assert_backends_agree(one, x + 1, targets=["eager"], reference_cache=cache).passed
    assert len(cache) == 4


def test_without_tolerances_each_target_is_judged_at_its_dtypes_default():
    """One relative error of 1e-3 on two targets: declared bfloat16 it is within torch.testing's bfloat16
    default (rtol 1.6e-2), declared float32 it is far beyond float32's (atol 1e-4, rtol 1e-5: parity check's
    default too). Given tolerances apply to every target alike."""
    from parity.api import Disagreement

    torch.manual_seed(0)
    model, x = torch.nn.Linear(6, 4), torch.randn(3, 6) * 10
    nudge = "tests.fixtures.tolerance:RelativeNudge"
    targets = [{"backend": nudge, "dtype": "bfloat16", "name": "nudge-bf16"}, {"backend": nudge, "name": "nudge-fp32"}]
    with pytest.raises(Disagreement) as info:
        assert_backends_agree(model, x, targets=targets)
    result = info.value.result
    assert result["nudge-bf16"].passed and (result["nudge-bf16"].rtol, result["nudge-bf16"].atol) == (1.6e-2, 1e-5)
    assert not result["nudge-fp32"].passed and (result["nudge-fp32"].rtol, result["nudge-fp32"].atol) == (1e-5, 1e-4)
    assert "nudge-bf16" not in str(info.value)
    given = assert_backends_agree(model, x, targets=targets, rtol=2e-3)
    assert given.passed and {t.rtol for t in given.targets.values()} == {2e-3}


def test_localize_and_fallback_from_python_name_the_culprit_and_its_fix(tmp_path):
    """The API's localize and fallback are `parity localize` / `parity fallback`: the chain's Offset adds its
    fault only when compiled (tests/fixtures/culprit.py), and nothing else differs."""
    import parity
    from tests.test_reduce import CHAIN

    exp = copy.deepcopy(CHAIN)
    exp["targets"][0]["fallback"] = []  # a compile target: its fallback kind is eager
    layers = parity.localize(exp)
    assert layers["culprit"] == "odd" and layers["tier1"]["passed"] is False
    found = parity.fallback(exp, target="compile-cpu", out=tmp_path / "out")
    assert found["passed"] and found["modules"] == ["odd"] and found["required_atol_after"] <= 1e-2
    assert [r["kind"] for r in read_records(tmp_path / "out")] == ["run", "fallback"]
    with pytest.raises(ParityError, match="no target 'compiel-cpu'; did you mean 'compile-cpu'"):
        parity.localize(exp, target="compiel-cpu")


class HoldsTensor(torch.nn.Module):
    """Adds a quantized or sparse buffer's values to its output: two copies that differ only in that buffer's
    scale (quantized) or its indices (sparse) compute different outputs."""

    def __init__(self, held: torch.Tensor):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("held", held)

    def forward(self, x):
        dense = self.held.dequantize() if self.held.is_quantized else self.held.to_dense()
        return self.lin(x) + dense.sum(0)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")  # torch's deepcopy of a quantized tensor
@pytest.mark.parametrize("kind", ["quantized", "sparse"])
def test_models_that_differ_only_in_a_quantized_or_sparse_tensor_share_no_digest(kind):
    """The reference cache and the artifact cache key a quantized tensor on its scale and a sparse one on its
    indices, not on the bytes of its values alone: else one model's reference outputs (or export) would be
    served for the other."""
    from parity.execute.cache import model_digest

    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    if kind == "quantized":  # the same integers, another scale
        held = [torch.quantize_per_tensor(values * scale, scale, 0, torch.quint8) for scale in (0.1, 0.2)]
        assert torch.equal(held[0].int_repr(), held[1].int_repr())
    else:  # the same values at other indices
        held = [torch.sparse_coo_tensor(torch.tensor([[0, 1], [i, 2]]), torch.tensor([1.0, 2.0]), (2, 3),
                                        check_invariants=True)
                for i in (0, 1)]
    torch.manual_seed(0)
    one = HoldsTensor(held[0])
    other = copy.deepcopy(one)
    other.held = held[1]
    x = torch.randn(2, 4)
    assert not torch.equal(one(x), other(x))
    assert model_digest(one) != model_digest(other)
    cache: dict = {}
    assert_backends_agree(one, x, targets=["eager"], reference_cache=cache)
    assert assert_backends_agree(other, x, targets=["eager"], reference_cache=cache).passed
    assert len(cache) == 2


def test_localize_and_fallback_from_python_take_tier_2_s_defaults_when_the_experiment_sets_none(tmp_path):
    """An experiment without `tiers.activations` (a run then skips tier 2): the API's localize and fallback are
    tier 2 at its defaults, as the commands are (the API's calls raised AttributeError on such a file)."""
    import parity

    exp = tiny_experiment([{"backend": "tests.fixtures.tiny:PerturbedEager", "dtype": "bfloat16",
                            "tolerances": {"gate": 1e-5, "rtol": 0.0}}])  # a nudged weight: far past this gate
    layers = parity.localize(exp)
    assert layers["tier1"]["passed"] is False and layers["levels"]
    found = parity.fallback(exp, out=tmp_path / "out")
    assert found["target"] == "PerturbedEager-cpu-bfloat16" and found["required_atol_before"] > 0
    assert [r["kind"] for r in read_records(tmp_path / "out")] == ["run", "fallback"]
    assert read_records(tmp_path / "out")[0]["config"]["tiers"]["activations"] is None  # the experiment as given
