"""Input sets: bundled photographs, files and globs, preprocessing, synthetic tensors, several tensors."""

from __future__ import annotations

import pytest
import torch

from parity.errors import ParityError
from parity.experiment import experiment_from_dict
from parity.inputs import build_inputs
from tests.support import FIXTURES, tiny_experiment


def inputs_of(spec: dict, batch: str = "stack"):
    data = tiny_experiment([{"backend": "torchscript"}])
    data["inputs"] = [{"name": "x", **spec}]
    exp = experiment_from_dict(data, "<dict>", FIXTURES)
    return build_inputs(exp.inputs[0], exp, batch)


def test_bundled_photos_with_imagenet_preprocessing():
    pre = {"resize": 64, "center_crop": 56, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    [x] = inputs_of({"images": ["sample:chelsea", "sample:coffee"], "preprocess": pre}).args
    assert x.shape == (2, 3, 56, 56) and x.dtype == torch.float32
    assert -3 < float(x.min()) < 0 < float(x.max()) < 3  # normalized, not raw [0, 255]


def test_files_and_globs_relative_to_the_experiment_folder():
    [x] = inputs_of({"images": ["images/*.png"], "preprocess": {"resize": [32, 40]}}).args
    assert x.shape == (2, 3, 32, 40)
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0


def test_resize_to_a_multiple():
    [x] = inputs_of({"images": ["images/cat.png"], "preprocess": {"resize_multiple": 32}}).args
    assert x.shape == (1, 3, 64, 96)  # 53 x 80 -> nearest multiples of 32


def test_detection_models_get_a_list_of_images_of_any_size():
    [images] = inputs_of({"images": ["sample:chelsea", "images/cup.png"]}, batch="list").args
    assert isinstance(images, list) and images[0].shape != images[1].shape


def test_images_of_different_sizes_cannot_be_stacked():
    with pytest.raises(ParityError, match="different sizes after preprocessing"):
        inputs_of({"images": ["sample:chelsea", "images/cup.png"]})


def test_synthetic_is_seeded_and_typed():
    a = inputs_of({"synthetic": {"shape": [2, 3], "seed": 4}}).args[0]
    b = inputs_of({"synthetic": {"shape": [2, 3], "seed": 4}}).args[0]
    assert torch.equal(a, b)
    ints = inputs_of({"synthetic": {"shape": [5], "dtype": "int64", "distribution": "randint", "low": 0, "high": 3}}).args[0]
    assert ints.dtype == torch.int64 and 0 <= int(ints.min()) and int(ints.max()) < 3
    u = inputs_of({"synthetic": {"shape": [100], "distribution": "uniform", "low": -2, "high": -1}}).args[0]
    assert -2 <= float(u.min()) and float(u.max()) <= -1


def test_several_tensors_positional_or_named():
    positional = inputs_of({"synthetic": [{"shape": [1, 4]}, {"shape": [1, 4], "distribution": "ones"}]})
    assert len(positional.args) == 2 and not torch.equal(*positional.args)
    named = inputs_of({"synthetic": {"image": {"shape": [1, 4]}, "mask": {"shape": [1, 4], "distribution": "ones"}}})
    assert named.args == () and set(named.kwargs) == {"image", "mask"}
