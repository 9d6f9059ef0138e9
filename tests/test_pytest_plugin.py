"""The pytest plugin, as a user's test file meets it (pytester). The plugin is loaded explicitly with
`-p parity.pytest_plugin` and nothing else autoloads, so these tests do not depend on how parity is
installed (its `pytest11` entry point registers it only after `pip install`)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

from tests.support import ROOT

pytest_plugins = ["pytester"]

USER_TESTS = '''
import pytest
import torch

from parity.backends.eager import EagerBackend


class CountingEager(EagerBackend):
    """The reference: counts how often it is prepared."""

    prepared = 0

    def prepare(self, model, example):
        CountingEager.prepared += 1
        super().prepare(model, example)


class Nowhere(EagerBackend):
    @classmethod
    def available(cls, spec):
        return "needs hardware this machine lacks"


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


X = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))


@pytest.mark.parity(targets=["torchscript", "eager:float64", "eager-cpu-bfloat16", "eager-cuda", "test_user:Nowhere"],
                    reference="test_user:CountingEager", atol=1e-2)
def test_agrees(parity):
    result = parity.check(build(), X)
    assert result.passed and result[parity.target.id].leaves[0]["name"] == "out"


@pytest.mark.parity(targets=["eager-cpu-bfloat16"], atol=1e-7, rtol=0)
def test_drifts(parity):
    parity.check(build(), X)


@pytest.mark.parity(targets=["test_user:Nowhere"])
def test_an_unrunnable_target_is_skipped_before_the_body_runs(parity):
    raise RuntimeError("the body ran, building a model for a target that cannot run here")


def test_the_reference_ran_once_for_three_targets():
    assert CountingEager.prepared == 1


def test_without_the_marker(parity):
    assert parity.check(build(), X, targets=["torchscript"]).passed


def test_one_of_several_targets_cannot_run(parity):
    parity.check(build(), X, targets=["torchscript", "test_user:Nowhere"])
'''


@pytest.fixture
def isolated(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PARITY_CACHE_DIR", "off")
    return pytester


def test_the_marker_runs_each_target_and_skips_those_that_cannot_run_here(isolated):
    isolated.makepyfile(test_user=USER_TESTS)
    result = isolated.runpytest("-p", "parity.pytest_plugin", "-rs", "-v", "--junitxml=junit.xml")
    cuda = torch.cuda.is_available()
    result.assert_outcomes(passed=6 if cuda else 5, skipped=3 if cuda else 4, failed=1)
    result.stdout.fnmatch_lines(["*test_agrees?torchscript-cpu? PASSED*", "*test_agrees?eager-cpu-float64? PASSED*",
                                 "*test_agrees?eager-cpu-bfloat16? PASSED*", "*test_drifts?eager-cpu-bfloat16? FAILED*",
                                 "*test_the_reference_ran_once_for_three_targets PASSED*"])
    result.stdout.fnmatch_lines(["*SKIPPED*Nowhere-cpu cannot run here: needs hardware this machine lacks*"])
    if not cuda:
        result.stdout.fnmatch_lines(["*SKIPPED*eager-cuda cannot run here: CUDA is not available*"])
    result.stdout.fnmatch_lines(["*Target eager-cpu-bfloat16 does not match reference eager-cpu*",
                                 "*Mismatched elements*"])
    cases = {c.get("name"): c for c in ET.parse(isolated.path / "junit.xml").getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_drifts[eager-cpu-bfloat16]"].iter("property")}
    assert props["parity.eager-cpu-bfloat16.passed"] == "False"
    assert props["parity.eager-cpu-bfloat16.failure_class"] == "numeric_drift"
    assert float(props["parity.eager-cpu-bfloat16.out.max_abs"]) > 1e-7
    props = {p.get("name"): p.get("value") for p in cases["test_agrees[torchscript-cpu]"].iter("property")}
    assert props["parity.reference"] == "CountingEager-cpu" and props["parity.torchscript-cpu.passed"] == "True"
    assert float(props["parity.torchscript-cpu.out.required_atol"]) == 0.0
    skipped = cases["test_one_of_several_targets_cannot_run"]  # checked what it could, then skipped: not a pass
    assert skipped.find("skipped") is not None and "Nowhere-cpu cannot run here" in skipped.find("skipped").get("message")
    assert {p.get("name"): p.get("value") for p in skipped.iter("property")}["parity.torchscript-cpu.passed"] == "True"


@pytest.mark.parametrize("marked, message", [
    ('@pytest.mark.parity(targets=["onnxruntme"])\ndef test_x(parity):\n    pass',
     "unknown target 'onnxruntme': no backend 'onnxruntme'; did you mean 'onnxruntime'?"),
    ('@pytest.mark.parity(targets=["compile"])\ndef test_x():\n    pass',
     "has @pytest.mark.parity but does not take the `parity` fixture"),
    ('@pytest.mark.parity(targets="compile")\ndef test_x(parity):\n    pass', "needs targets=[...], a list"),
    ('@pytest.mark.parity(targets=["compile"], atl=1)\ndef test_x(parity):\n    pass', "unknown setting(s) atl"),
    ('@pytest.mark.parity(targets=[1, None])\ndef test_x(parity):\n    pass',
     "target 1: a target is an id such as 'compile' or a backend entry (a mapping), not a int"),
    ('@pytest.mark.parity(targets=[{"backend": "eager", "dtype": 5}])\ndef test_x(parity):\n    pass', "dtype"),
])
def test_a_wrong_marker_is_a_clear_error(isolated, marked, message):
    isolated.makepyfile(test_wrong="import pytest\n\n\n" + marked + "\n")
    result = isolated.runpytest("-p", "parity.pytest_plugin")
    assert result.ret != 0
    assert message in result.stdout.str() + result.stderr.str()
    assert "ValidationError" not in result.stdout.str() + result.stderr.str()  # a UsageError, not a traceback


def test_the_plugin_costs_nothing_where_it_is_not_used(isolated):
    """pytest loads the plugin in every run once parity is installed: it must not import torch, nor change
    a test that does not use it."""
    isolated.makepyfile(test_plain="import sys\n\n\ndef test_plain():\n    assert 'torch' not in sys.modules\n")
    isolated.syspathinsert(ROOT / "src")
    result = isolated.runpytest_subprocess("-p", "parity.pytest_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    done = subprocess.run([sys.executable, "-c", "import sys, parity.pytest_plugin; print(sorted(m for m in sys.modules "
                           "if m.split('.')[0] in ('torch', 'numpy', 'pydantic')))"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


CI_TESTS = '''
import pytest
import torch

from parity.backends.eager import EagerBackend


class Nowhere(EagerBackend):
    @classmethod
    def available(cls, spec):
        return "needs hardware this machine lacks"


X = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))


@pytest.mark.parity(targets=["torchscript", "test_ci:Nowhere"])
def test_model(parity):
    torch.manual_seed(0)
    parity.check(torch.nn.Linear(4, 2), X)


@pytest.mark.parity(targets=["eager-cpu-bfloat16"], atol=1e-7, rtol=0)
def test_drifts(parity):
    torch.manual_seed(0)
    parity.check(torch.nn.Linear(4, 2), X)
'''


@pytest.mark.parametrize("how", [["--parity-require-available"], ["-o", "parity_require_available=true"]])
def test_a_required_target_that_cannot_run_fails_the_session_with_its_reason(isolated, how):
    isolated.makepyfile(test_ci=CI_TESTS)
    result = isolated.runpytest("-p", "parity.pytest_plugin", "-k", "test_model", *how)
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*Nowhere-cpu cannot run here: needs hardware this machine lacks "
                                 "(--parity-require-available: every target must run)*"])
    plain = isolated.runpytest("-p", "parity.pytest_plugin", "-k", "test_model")
    plain.assert_outcomes(passed=1, skipped=1)


def test_parity_targets_chooses_the_targets_from_the_command_line(isolated):
    isolated.makepyfile(test_ci=CI_TESTS)
    result = isolated.runpytest("-p", "parity.pytest_plugin", "-v", "-k", "test_model",
                                "--parity-targets", "torchscript,eager:float64")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_model?torchscript-cpu? PASSED*", "*test_model?eager-cpu-float64? PASSED*"])
    wrong = isolated.runpytest("-p", "parity.pytest_plugin", "--parity-targets", "onnxruntme")
    assert wrong.ret != 0 and "did you mean 'onnxruntime'?" in wrong.stdout.str() + wrong.stderr.str()


def test_a_typo_in_parity_targets_is_one_line_naming_the_flag(isolated):
    """Before collection, as a usage error: one line that names --parity-targets, not a collection error's
    traceback blaming the marker of each test."""
    isolated.makepyfile(test_ci=CI_TESTS)
    wrong = isolated.runpytest("-p", "parity.pytest_plugin", "--parity-targets", "torchscript,onnxruntme")
    said = [line for line in (wrong.stdout.str() + wrong.stderr.str()).splitlines() if line.strip()]
    assert wrong.ret == pytest.ExitCode.USAGE_ERROR
    assert len(said) == 1, said
    assert said[0].startswith("ERROR: --parity-targets onnxruntme: unknown target 'onnxruntme': no backend "
                              "'onnxruntme'; did you mean 'onnxruntime'?")
    assert "@pytest.mark.parity" not in said[0]


def test_a_failing_check_shows_the_test_and_the_numbers_not_paritys_source(isolated):
    isolated.makepyfile(test_ci=CI_TESTS)
    result = isolated.runpytest("-p", "parity.pytest_plugin", "-k", "test_drifts")
    result.assert_outcomes(failed=1)
    printed = result.stdout.str()
    assert "parity.check(torch.nn.Linear(4, 2), X)" in printed and "Mismatched elements" in printed
    assert "pytest_plugin.py" not in printed and "api.py" not in printed and "def assert_backends_agree" not in printed


SESSION_TESTS = '''
import importlib.util
import os

import pytest

SWITCHES = ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED")


def test_a_test_without_parity_keeps_its_environment():
    assert not any(name in os.environ for name in SWITCHES)


def test_a_test_with_parity_runs_contained(parity):
    assert all(os.environ[name] == "1" for name in SWITCHES)
    with pytest.raises(ImportError):
        import openvino_telemetry  # noqa: F401


def test_after_it_the_environment_is_the_users_again():
    assert not any(name in os.environ for name in SWITCHES)
    if importlib.util.find_spec("openvino_telemetry") is not None:
        import openvino_telemetry  # noqa: F401  # the user's own import works
'''


def test_the_plugin_leaves_the_environment_of_other_tests_alone(isolated, monkeypatch):
    """Before: `import parity` (the plugin, in every session) set ORT_DISABLE_TELEMETRY=1 for every test and
    made a user's own `import openvino_telemetry` fail, in tests that never use parity."""
    for name in ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED"):
        monkeypatch.delenv(name, raising=False)  # this session's own tests run contained
    isolated.makepyfile(test_session=SESSION_TESTS)
    isolated.syspathinsert(ROOT / "src")
    result = isolated.runpytest_subprocess("-p", "parity.pytest_plugin", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=3)
