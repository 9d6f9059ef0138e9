"""Model sources and weights: torchvision, someone's repository, python entries; seeded init; files."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import save_file

from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.models import build_model
from parity.models.sources import loaded_from
from tests.support import FIXTURES, tiny_experiment


def experiment(model: dict, tmp_path=None):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["models"] = [{"name": "m", **model}]
    return experiment_from_dict(data, "<dict>", tmp_path or FIXTURES)


def test_seeded_init_is_identical_on_every_build_and_differs_by_seed():
    exp = experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"})
    a, b = build_model(exp.models[0], exp), build_model(exp.models[0], exp)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert a is not b and not a.training
    exp.seed = 1
    c = build_model(exp.models[0], exp)
    assert not torch.equal(a.conv.weight, c.conv.weight)


def test_a_model_s_own_seed_wins_over_the_experiment_s_for_its_weights_only(tmp_path):
    """One architecture under several seeds (the study's seed variance): `seed: 1` on the model draws what
    the experiment's seed 1 draws; the same model without it keeps the experiment's; with weights it is refused."""
    own = experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "seed": 1, "init": "fan_in"})
    plain = experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "init": "fan_in"})
    assert own.seed == plain.seed == 0
    seeded_one, default = build_model(own.models[0], own), build_model(plain.models[0], plain)
    plain.seed = 1
    experiment_one = build_model(plain.models[0], plain)
    assert torch.equal(seeded_one.conv.weight, experiment_one.conv.weight)
    assert not torch.equal(seeded_one.conv.weight, default.conv.weight)
    with pytest.raises(ParityError, match="'seed' applies only to a seeded init"):
        experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "seed": 1, "weights": "w.pt"}, tmp_path)


def test_repo_import_leaves_sys_path_and_modules_as_they_were():
    """Two repositories each have a `model.py`: each must get its own, and neither may leak."""
    path_before = list(sys.path)
    exp_a = experiment({"source": "repo", "path": "repo_a", "entry": "model:RepoNet", "params": {"classes": 3}})
    exp_b = experiment({"source": "repo", "path": "repo_b", "entry": "model:make", "params": {"width": 5}})
    a = build_model(exp_a.models[0], exp_a)
    b = build_model(exp_b.models[0], exp_b)
    assert type(a).__name__ == "RepoNet" and a.head.out_features == 3
    assert b[-1].out_features == 5
    assert sys.path == path_before and "model" not in sys.modules and "hubconf" not in sys.modules
    repos = [(FIXTURES / name).resolve() for name in ("repo_a", "repo_b")]
    assert not [name for name, module in list(sys.modules.items()) if any(loaded_from(module, r) for r in repos)]


# Standard-library modules a test process is unlikely to have imported: the repository below imports one.
RARE_STDLIB = ("colorsys", "wave", "netrc", "tabnanny", "xdrlib", "sunau", "mailcap", "nntplib")


def test_repo_import_forgets_the_repositorys_modules_but_keeps_the_libraries_they_imported(tmp_path):
    """Unloading a library imported while building (torch's, transformers' internals) breaks every export after
    it; the folder's own modules (`model`, its package `repo_lib`) must still go."""
    library = next((name for name in RARE_STDLIB if name not in sys.modules), None)
    if library is None:
        pytest.skip("every candidate library is imported already")
    (tmp_path / "repo_lib").mkdir()  # a namespace package: no file of its own, only its folder (a name no
    # installed distribution has: llama-cpp-python ships a top-level `lib` folder, which a namespace `lib` would span)
    (tmp_path / "repo_lib" / "layers.py").write_text("import torch\n\n\ndef head():\n    return torch.nn.Linear(2, 2)\n")
    (tmp_path / "model.py").write_text(f"import {library}  # noqa: F401\nfrom repo_lib.layers import head\n\n\n"
                                       "def make():\n    return head()\n")
    exp = experiment({"source": "repo", "path": ".", "entry": "model:make"}, tmp_path)
    assert build_model(exp.models[0], exp).out_features == 2
    assert library in sys.modules
    assert not {"model", "repo_lib", "repo_lib.layers"} & set(sys.modules)


def test_repo_hubconf_entry():
    exp = experiment({"source": "repo", "path": "repo_a", "hubconf": "reponet", "params": {"classes": 2}})
    assert build_model(exp.models[0], exp).head.out_features == 2
    exp = experiment({"source": "repo", "path": "repo_a", "hubconf": "repnet"})
    with pytest.raises(ParityError, match="did you mean 'reponet'"):
        build_model(exp.models[0], exp)


def test_bad_params_and_non_modules_are_user_errors():
    exp = experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "params": {"colours": 3}})
    with pytest.raises(ParityError, match="does not accept params"):
        build_model(exp.models[0], exp)
    exp = experiment({"source": "python", "entry": "tests.fixtures.tiny:Pair"})
    with pytest.raises(ParityError):
        build_model(exp.models[0], exp)
    with pytest.raises(ParityError, match="cannot import module"):
        experiment_from_dict(tiny_experiment([{"backend": "nosuch.module:Backend"}]))


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_local_weights_are_loaded(tmp_path, fmt):
    exp = experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn"}, tmp_path)
    state = {k: torch.full_like(v, 0.5) for k, v in build_model(exp.models[0], exp).state_dict().items()}
    path = tmp_path / f"w.{fmt}"
    save_file(state, str(path)) if fmt == "safetensors" else torch.save({"state_dict": state}, path)
    exp = experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "weights": path.name}, tmp_path)
    model = build_model(exp.models[0], exp)
    assert torch.equal(model.conv.weight, torch.full_like(model.conv.weight, 0.5))


def test_weights_that_do_not_fit_are_named(tmp_path):
    save_file({"other.weight": torch.zeros(1)}, str(tmp_path / "w.safetensors"))
    exp = experiment({"source": "python", "entry": "tests.fixtures.tiny:tiny_cnn", "weights": "w.safetensors"}, tmp_path)
    with pytest.raises(ParityError, match="do not fit the model: missing"):
        build_model(exp.models[0], exp)


def test_default_weights_are_never_downloaded(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty hub cache
    exp = experiment({"source": "torchvision", "builder": "resnet18", "weights": "DEFAULT"})
    with pytest.raises(ParityError, match="not in the local torch hub cache.*pass a local file"):
        build_model(exp.models[0], exp)


@pytest.mark.numerics
def test_fan_in_init_gives_varied_outputs_where_the_builder_init_collapses():
    base = {"source": "torchvision", "builder": "mobilenet_v3_small", "params": {"num_classes": 10}}
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    exp = experiment(base)
    with torch.no_grad():
        collapsed = build_model(exp.models[0], exp)(x)
        exp = experiment({**base, "init": "fan_in"})
        varied = build_model(exp.models[0], exp)(x)
    assert collapsed.abs().max() < 1e-6 < 1e-2 < varied.abs().max()


def test_detection_builders_do_not_fetch_a_backbone():
    exp = experiment({"source": "torchvision", "builder": "fasterrcnn_mobilenet_v3_large_320_fpn",
                      "params": {"num_classes": 3}})
    assert build_model(exp.models[0], exp).roi_heads is not None


def test_a_python_entry_is_found_next_to_the_experiment_file_from_any_working_directory(tmp_path, monkeypatch):
    folder = tmp_path / "experiments"
    folder.mkdir()
    (folder / "beside_the_file_models.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Linear(3, 2)\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path_before = list(sys.path)
    exp = experiment({"source": "python", "entry": "beside_the_file_models:build"}, folder)
    assert isinstance(build_model(exp.models[0], exp), torch.nn.Linear)
    assert sys.path == path_before  # the folder was first only while the entry was imported


def test_a_python_entry_found_nowhere_says_where_it_looked_and_a_missing_import_inside_it_does_not(tmp_path):
    with pytest.raises(ParityError) as missing:
        experiment({"source": "python", "entry": "no_such_models_module:build"}, tmp_path)
    assert f"looked in {tmp_path}, the experiment file's folder" in str(missing.value)
    (tmp_path / "imports_a_missing_library.py").write_text("import no_such_library_either\n\ndef build(): pass\n")
    with pytest.raises(ParityError) as inner:
        experiment({"source": "python", "entry": "imports_a_missing_library:build"}, tmp_path)
    assert "no_such_library_either" in str(inner.value) and "looked in" not in str(inner.value)
