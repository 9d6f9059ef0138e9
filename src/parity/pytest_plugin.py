"""parity in pytest: the `parity` fixture and the `@pytest.mark.parity(targets=[...])` marker.

    @pytest.mark.parity(targets=["compile", "onnxruntime", "eager-cpu-bfloat16", "eager-cuda"], atol=1e-4)
    def test_my_model_agrees(parity):
        parity.check(build_my_model(), torch.randn(2, 3, 224, 224))

runs the test once per target (ids as the tables print them: `test_my_model_agrees[eager-cpu-bfloat16]`),
skips a target that cannot run on this machine with the reason (no CUDA, a missing package), runs the
reference once per model and inputs in the session, and puts each target's numbers in the JUnit XML
(testcase properties, as `record_property` writes them). Without the marker, `parity.check(model, inputs, targets=[...])` checks the targets
it is given. A failing check shows the test's line and the numbers, not parity's own frames.

Options: `--parity-targets T,T...` checks those targets in every marked test instead of the marker's (a CI job
per backend); `--parity-require-available` (or the ini key `parity_require_available = true`) makes a target
that cannot run here fail with its reason instead of skipping.

pytest loads this module in every run once parity is installed, so it imports nothing heavy itself:
torch and parity's checking code load only when a test uses the marker or the fixture. Nor does it change
the session: what `import parity` switches off (telemetry, parity/offline.py) is switched back at once, and
off again only for the time of each test that takes the `parity` fixture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

_REFERENCES = pytest.StashKey[dict]()  # reference outputs by model, inputs and reference backend: one session
_CANNOT_RUN = pytest.StashKey[list]()  # a required target that cannot run here: the test fails, its body unrun


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity")
    group.addoption("--parity-targets", metavar="T,T", action="append",
                    help="check these targets (ids as parity's tables print them) in every @pytest.mark.parity "
                         "test instead of the marker's; repeatable or comma-separated")
    group.addoption("--parity-require-available", action="store_true", default=None,
                    help="a target that cannot run on this machine fails the test with its reason (default: it "
                         "is skipped); also the ini key parity_require_available")
    parser.addini("parity_require_available", type="bool", default=False,
                  help="parity: a target that cannot run here fails instead of being skipped")


def _require_available(config: pytest.Config) -> bool:
    given = config.getoption("parity_require_available")
    return bool(config.getini("parity_require_available") if given is None else given)


def _not_run(config: pytest.Config, reasons: list[str]) -> None:
    """A target (or the reference) that cannot run here: skipped, or failed with its reason when the session
    requires every target to run."""
    __tracebackhide__ = True
    if _require_available(config):
        pytest.fail("; ".join(reasons) + " (--parity-require-available: every target must run)", pytrace=False)
    pytest.skip("; ".join(reasons))


def pytest_configure(config: pytest.Config) -> None:
    from parity.offline import release

    release()
    config.addinivalue_line(
        "markers", "parity(targets=[...], reference='eager', atol=None, rtol=None): run the test once per "
                   "target (BACKEND[-DEVICE][-DTYPE], e.g. eager-cpu-bfloat16); its `parity` fixture checks that "
                   "target against the reference; a target that cannot run here is skipped")
    config.stash[_REFERENCES] = {}
    _option_targets(config)  # a typo in --parity-targets: one line naming the flag now, not a collection error


def _option_targets(config: pytest.Config) -> list[Any] | None:
    """The targets --parity-targets gives (None: the option is absent), each read by the target grammar; one
    it cannot read is a usage error naming the flag, with the grammar's did-you-mean."""
    chosen = config.getoption("parity_targets")
    if not chosen:
        return None
    from parity.api import target_spec
    from parity.errors import ParityError

    specs = []
    for text in (t.strip() for given in chosen for t in given.split(",")):
        if not text:
            continue
        try:
            specs.append(target_spec(text))
        except ParityError as exc:
            raise pytest.UsageError(f"--parity-targets {text}: {exc.problems[0]}") from None
    return specs


@dataclass(frozen=True)
class MarkerSettings:
    """What @pytest.mark.parity says: its targets, and the keywords of `assert_backends_agree` it sets
    (`reference`, `atol`, `rtol`: those it gives, which a `parity.check` call's own override)."""

    targets: list[Any] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)


def _settings(marker) -> MarkerSettings:
    """The marker's settings, as the test wrote them; `targets` may also be its one positional argument."""
    given = dict(marker.kwargs)
    if marker.args:
        if len(marker.args) > 1 or "targets" in given:
            raise pytest.UsageError("@pytest.mark.parity takes the targets once: parity(targets=[...])")
        given["targets"] = marker.args[0]
    unknown = set(given) - {"targets", "reference", "atol", "rtol"}
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.parity: unknown setting(s) {', '.join(sorted(unknown))} "
                                "(known: targets, reference, atol, rtol)")
    targets = given.pop("targets", None)
    if isinstance(targets, str) or not targets:
        raise pytest.UsageError("@pytest.mark.parity needs targets=[...], a list of at least one target")
    return MarkerSettings(targets, given)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("parity")
    if marker is None:
        return
    if "parity" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid} has @pytest.mark.parity but does not take the "
                                "`parity` fixture, which checks each target")
    from parity.api import target_spec
    from parity.errors import ParityError

    specs = _option_targets(metafunc.config)
    if specs is None:
        try:
            specs = [target_spec(t) for t in _settings(marker).targets]
        except ParityError as exc:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.parity: {exc.problems[0]}") from None
    metafunc.parametrize("parity", specs, ids=[s.id for s in specs], indirect=True)


class Parity:
    """What a test receives as `parity`: `check(model, inputs)` checks its target (or the `targets` given)
    against the reference with `parity.assert_backends_agree` (judged by `parity.verify.judge`, as `parity run`
    judges) and returns the `Agreement`; a disagreement fails the test with torch.testing-style lines."""

    def __init__(self, target, settings: MarkerSettings, references: dict, record_property, config: pytest.Config):
        self.target = target  # the marker's target of this test (a BackendSpec), or None without the marker
        self.settings = settings
        self._references = references
        self._record = record_property
        self._config = config

    def check(self, model, inputs, targets: list | None = None, **settings: Any):
        """`settings`: atol, rtol, reference; they win over the marker's."""
        __tracebackhide__ = True  # a failure shows the test's line and the numbers, not this frame
        from parity.api import Disagreement, assert_backends_agree

        if targets is None:
            if self.target is None:
                raise pytest.UsageError("parity.check(model, inputs) without targets=[...] needs the test to have "
                                        "@pytest.mark.parity(targets=[...])")
            targets = [self.target]
        options = self.settings.options | settings
        _, reference_unavailable = _split_by_availability([options.get("reference", "eager")])
        if reference_unavailable:
            _not_run(self._config, [f"the reference {reference_unavailable[0]}"])
        runnable, unavailable = _split_by_availability(targets)
        if not runnable:
            _not_run(self._config, unavailable)
        try:
            result = assert_backends_agree(model, inputs, runnable, reference_cache=self._references, **options)
        except Disagreement as exc:
            self._record_numbers(exc.result)
            raise
        self._record_numbers(result)
        if unavailable:  # the others agree, but these were not checked: not a pass
            _not_run(self._config, unavailable)
        return result

    def _record_numbers(self, result) -> None:
        """The JUnit XML properties: per target its verdict and numbers, and per leaf its own."""
        self._record("parity.reference", result.reference)
        for target, found in result.targets.items():
            self._record(f"parity.{target}.passed", found.passed)
            for key in ("failure_class", "required_atol", "max_abs"):
                if getattr(found, key) is not None:
                    self._record(f"parity.{target}.{key}", getattr(found, key))
            for leaf in found.leaves:
                for key in ("max_abs", "max_rel", "required_atol", "mismatch_fraction"):
                    if leaf.get(key) is not None:
                        self._record(f"parity.{target}.{leaf['name']}.{key}", leaf[key])


def _split_by_availability(targets: list) -> tuple[list, list[str]]:
    """The targets that can run here, and why each of the others cannot."""
    from parity.api import target_spec
    from parity.backends import backend_class

    runnable, unavailable = [], []
    for target in targets:
        spec = target_spec(target)
        reason = backend_class(spec.backend).available(spec)
        if reason:
            unavailable.append(f"{spec.id} cannot run here: {reason}")
        else:
            runnable.append(spec)
    return runnable, unavailable


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    """A test whose required target cannot run here fails with the reason before its body runs."""
    if _CANNOT_RUN in pyfuncitem.stash:
        _not_run(pyfuncitem.config, pyfuncitem.stash[_CANNOT_RUN])


@pytest.fixture
def parity(request: pytest.FixtureRequest):
    """Checks a model on the marker's target (see the module's docstring); skips the test up front when
    that target cannot run on this machine (fails it, with --parity-require-available). Telemetry is off for the
    test's time (parity/offline.py)."""
    from parity.offline import contained

    with contained():
        yield _parity(request)


def _parity(request: pytest.FixtureRequest) -> Parity:
    marker = request.node.get_closest_marker("parity")
    settings = _settings(marker) if marker is not None else MarkerSettings()
    target = getattr(request, "param", None)
    if target is not None:
        _, unavailable = _split_by_availability([target])
        if unavailable and _require_available(request.config):
            request.node.stash[_CANNOT_RUN] = unavailable  # failed in the call phase, not as a setup error
        elif unavailable:
            _not_run(request.config, unavailable)
    record = lambda name, value: request.node.user_properties.append((name, value))  # noqa: E731 - as record_property,
    return Parity(target, settings, request.config.stash[_REFERENCES], record, request.config)  # without its xunit2 warning per test
