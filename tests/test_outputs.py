"""Every output is flattened to named leaves; nothing is dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.outputs import Opaque, flatten, map_tensors
from tests.fixtures.tiny import Output, Pair


def test_nested_containers_get_stable_names():
    t = torch.zeros(2)
    out = {"dets": [{"boxes": t, "labels": t}], "pair": Pair(t, t), "count": 2, "none": None, "arr": np.ones(2)}
    leaves = flatten(out)
    assert list(leaves) == [
        "out['dets'][0]['boxes']", "out['dets'][0]['labels']", "out['pair'].logits", "out['pair'].features",
        "out['count']", "out['none']", "out['arr']",
    ]
    assert isinstance(leaves["out['arr']"], torch.Tensor)


def test_detection_style_list_of_dicts():
    leaves = flatten([{"boxes": torch.zeros(3, 4), "scores": torch.zeros(3)}, {"boxes": torch.zeros(0, 4)}])
    assert "out[0]['boxes']" in leaves and "out[1]['boxes']" in leaves


def test_dataclass_fields_and_opaque_objects():
    leaves = flatten(Output(torch.ones(1), "ok"))
    assert list(leaves) == ["out.logits", "out.note"]
    assert flatten(object()) == {"out": Opaque("object")}


def test_empty_containers_stay_visible():
    assert flatten({"a": [], "b": torch.ones(1)})["out['a']"] == []


def test_map_tensors_keeps_container_types():
    out = map_tensors({"p": Pair(torch.ones(1), [torch.ones(1)]), "d": Output(torch.ones(1), "x")}, lambda t: t * 2)
    assert isinstance(out["p"], Pair) and isinstance(out["d"], Output)
    assert out["p"].features[0].item() == 2.0 and out["d"].note == "x"


def test_an_object_with_a_layers_list_that_is_no_cache_stays_opaque():
    """Only a transformers cache is flattened by its layers' keys and values: another object with `.layers` (and a
    `.logits` beside it) would have its other fields left uncompared, so it is an opaque leaf (a failure), never
    a pass on the layers alone."""
    from types import SimpleNamespace

    layer = SimpleNamespace(keys=torch.zeros(2), values=torch.ones(2))
    out = SimpleNamespace(layers=[layer], logits=torch.zeros(3))
    [(name, leaf)] = flatten(out).items()
    assert name == "out" and isinstance(leaf, Opaque)


def test_a_transformers_cache_is_compared_by_its_layers_keys_and_values():
    transformers = pytest.importorskip("transformers")
    cache = transformers.DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4), layer_idx=0)
    assert list(flatten({"cache": cache})) == ["out['cache'].layers[0].keys", "out['cache'].layers[0].values"]
