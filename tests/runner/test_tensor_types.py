"""Localization and fallback in a typed-tensor file's terms (runner/tensor_types.py), on a constructed target: a
backend with the TensorTypes capability whose logits move by a known, seeded amount for each of its tensor groups
left at the target's type (`PERTURBED`), so that which group departs, and which groups to keep, are known. No
llama.cpp runs here (tests/backends/test_llamacpp.py mixes real GGUF files)."""

from __future__ import annotations

import pytest
import torch
import yaml

from parity.backends.base import TensorGroup
from parity.backends.eager import EagerBackend, EagerOptions
from parity.experiment.loading import experiment_from_dict
from parity.report.console import fallback_lines, group_rows
from parity.runner.runner import Runner
from parity.runner.tensor_types import has_tensor_types

VOCABULARY = 16
GROUPS = ("token_embd", "blk.0.attn", "blk.0.ffn", "blk.1.attn", "blk.1.ffn")
PERTURBED = {"blk.1.ffn": 4.0, "blk.0.attn": 0.2}  # the logits' offset scale of each group at the target's type
FLOOR = 0.1  # an offset no type removes (the kernels' own): the all-F16 file's KLD
BYTES, KEPT_BYTES = 100, 200  # each group's bytes at the target's type, and at the kept type


class SmallLM(torch.nn.Module):
    """A seeded causal 'language model': each position's logits from its own token."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCABULARY, 8)
        self.head = torch.nn.Linear(8, VOCABULARY)

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.head(self.embed(input_ids)) * 3.0}


class TypedOptions(EagerOptions):
    keep: list[str] = []
    keep_type: str = "Q8_0"


class Typed(EagerBackend):
    """A target with tensor groups: each of PERTURBED's groups left at the target's type adds its scale times a
    seeded offset to the logits; kept at another type, it adds nothing."""

    name = "typed"
    Options = TypedOptions

    def prepare(self, model, example):
        super().prepare(model, example)
        self.keep(self.options.keep, self.options.keep_type)

    def tensor_groups(self):
        return [TensorGroup(g, (g + ".weight",), "Q4_0", BYTES) for g in GROUPS]

    def keep(self, groups, type):
        self.kept = {g for g in GROUPS if any(g == k or g.startswith(k + ".") for k in groups)}
        return BYTES * len(GROUPS) + (KEPT_BYTES - BYTES) * len(self.kept)

    def run(self, inputs):
        out = super().run(inputs)
        out["logits"] = out["logits"] + FLOOR * torch.randn(out["logits"].shape, generator=torch.Generator().manual_seed(50))
        for i, group in enumerate(GROUPS):
            if group in PERTURBED and group not in self.kept:
                noise = torch.randn(out["logits"].shape, generator=torch.Generator().manual_seed(i))
                out["logits"] = out["logits"] + PERTURBED[group] * noise
        return out


def _experiment(targets: list[dict]) -> dict:
    return {"name": "typed", "seed": 0, "repeats": 1,
            "models": [{"name": "lm", "source": "python", "entry": "tests.runner.test_tensor_types:SmallLM",
                        "task": "text-generation"}],
            "inputs": [{"name": "tokens", "synthetic": {
                "input_ids": {"shape": [4, 32], "dtype": "int64", "distribution": "randint", "high": VOCABULARY}}}],
            "targets": targets,
            "tiers": {"tasks": {"text-generation": {"top1_agreement": 0.0, "kl_mean": 0.05, "new_tokens": 0}}}}


TARGET = {"backend": "tests.runner.test_tensor_types:Typed", "name": "typed-q4"}


def _runner(tmp_path, targets=(TARGET,)) -> tuple[Runner, tuple]:
    exp = experiment_from_dict(_experiment(list(targets)), base_dir=tmp_path)
    runner = Runner(exp, tmp_path / "out")
    return runner, runner.one_check()


def test_the_capability_is_detected_on_the_backend_class():
    from parity.config.schema import BackendSpec

    assert has_tensor_types(BackendSpec(**TARGET)) and not has_tensor_types(BackendSpec(backend="eager"))


def test_localize_names_the_block_and_the_group_that_depart(tmp_path):
    """blk.1.ffn carries the large offset: its block is ranked first with nearly all the share, and split, its FFN
    adds the KLD and its attention none; token_embd, unperturbed, adds nothing over the floor (the offset every
    file has)."""
    runner, (model, target, inputs) = _runner(tmp_path)
    record = runner.localize(model, target, inputs)
    written = record.model_dump(exclude_unset=True, exclude={"kind"})  # as the run's records.jsonl holds it
    found = record.tensor_groups
    # the keys in the order parity always wrote them: a typed record, made once, dumps what it was made from
    assert list(written)[:6] == ["model", "inputs", "target", "reference", "tier", "mode"]
    assert list(written["tensor_groups"]["groups"][0]) == ["name", "parent", "type", "kl_mean", "kl_mean_se", "kl_added",
                                                           "same_top1", "top1_agreement", "share"]
    rows = {r.name: r for r in found.groups}
    assert record.mode == "tensor groups" and record.culprit == "blk.1"
    assert rows["blk.1"].share > 0.9 and rows["token_embd"].kl_added == 0.0
    assert sum(r.share for r in found.groups if r.parent is None) == pytest.approx(1.0)  # shares of what they add
    assert rows["blk.1.ffn"].parent == "blk.1" and rows["blk.1.ffn"].kl_added > 0 == rows["blk.1.attn"].kl_added
    assert found.floor.kl_mean > 0 and found.whole.kl_mean > rows["blk.1"].kl_mean * 0.9
    assert 0 < rows["blk.1"].kl_mean_se < rows["blk.1"].kl_mean and 0 < found.whole.kl_mean_se < found.whole.kl_mean
    assert [r[0] for r in group_rows(record)][:3] == ["blk.1", "  blk.1.attn", "  blk.1.ffn"]
    assert "blk.1 departs most" in record.verdict
    from parity.report.next_steps import single_culprit

    assert not single_culprit(record)  # a tensor group is no module: parity reduce is not offered
    from parity.records.view import RunView
    from parity.report import write_reports

    write_reports(tmp_path / "out", RunView.read(tmp_path / "out"), names=("report.md", "report.html"))
    markdown, html = ((tmp_path / "out" / name).read_text() for name in ("report.md", "report.html"))
    assert "| blk.1 | Q4_0 |" in markdown and "| ↳ blk.1.ffn | Q4_0 |" in markdown
    assert "<td>blk.1.ffn</td>" in html.replace("&nbsp;", "") and "mean KLD" in html


def test_fallback_keeps_the_fewest_groups_and_its_snippet_passes_when_pasted(tmp_path):
    """blk.1 alone at the kept type leaves blk.0.attn's small offset, under the KL threshold: the fewest groups are
    [blk.1], with the bytes it costs; the snippet, pasted into the experiment's targets, runs and passes tier 3, and
    its check passes as the target's own entry gates it (its `tolerances: {gate: tier3}` kept in the snippet)."""
    gated = {**TARGET, "tolerances": {"gate": "tier3"}}
    runner, (model, target, inputs) = _runner(tmp_path, [gated])
    result = runner.find_fallback(model, target, inputs, tier=3)
    found = result.tensor_types
    assert result.passed and result.modules == ["blk.1"] and not result.whole_model
    assert (found.bytes_before, found.bytes_after) == (5 * BYTES, 5 * BYTES + 2 * (KEPT_BYTES - BYTES))
    assert result.task_before["kl_mean"] > 0.05 >= result.task_after["kl_mean"]
    lines = [text for _, text in fallback_lines(result, 1e-4, False, "lm", "text-generation")]
    assert found.snippet in lines and any("tokens/s" in line for line in lines)
    pasted = yaml.safe_load(found.snippet)
    assert pasted == [{**gated, "name": "typed-q4-kept", "options": {"keep": ["blk.1"], "keep_type": "Q8_0"}}]
    from parity.api import run_experiment

    records = run_experiment(_experiment([gated, *pasted]), out=tmp_path / "pasted")
    for tier in (3, 1):
        passed = {r["target"]: r["passed"] for r in records if r["kind"] == "check" and r["tier"] == tier}
        assert passed == {"typed-q4": False, "typed-q4-kept": True}, tier


class Drifting(Typed):
    """Typed, with an offset no type removes (its kernels' own): no set of kept groups passes."""

    def run(self, inputs):
        out = super().run(inputs)
        out["logits"] = out["logits"] + 4.0 * torch.randn(out["logits"].shape, generator=torch.Generator().manual_seed(99))
        return out


def test_no_prefix_that_passes_is_said(tmp_path):
    runner, (model, target, inputs) = _runner(tmp_path, [{**TARGET, "backend": "tests.runner.test_tensor_types:Drifting"}])
    result = runner.find_fallback(model, target, inputs, tier=3)
    assert not result.passed and result.tensor_types.snippet is None and result.next_step
    lines = [text for _, text in fallback_lines(result, 1e-4, False, "lm", "text-generation")]
    assert any("no prefix" in line for line in lines)


@pytest.mark.parametrize("task", ["classification"])
def test_a_model_of_another_task_is_refused_in_one_line(tmp_path, task):
    data = _experiment([TARGET])
    data["models"][0]["task"] = task
    exp = experiment_from_dict(data, base_dir=tmp_path)
    runner = Runner(exp, None)
    with pytest.raises(Exception, match="text-generation statistics"):
        runner.localize(*runner.one_check())
