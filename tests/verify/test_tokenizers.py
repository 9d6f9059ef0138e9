"""Tokenizer parity (verify/tokenizers.py): a target with its own tokenizer that tokenizes a text otherwise fails as
`tokenizer_mismatch`, named by the first differing token and its text, while its logits are still judged on the
reference's ids. The ids are constructed: no tokenizer runs here."""

from __future__ import annotations

import torch

from parity import taxonomy as tx
from parity.backends.base import Backend
from parity.config.schema import BackendSpec
from parity.execute.execution import Execution, OwnTokens, first_difference, own_tokens
from parity.experiment.loading import experiment_from_dict
from parity.inputs import Inputs
from parity.verify.judge import judge
from parity.verify.tokenizers import first_mismatch
from tests.support import tiny_experiment


def _tokens(reference, reference_pieces, target, target_pieces):
    """own_tokens's record of one text from both sides' ids and token texts."""
    at = first_difference(reference, target)
    return OwnTokens(texts=["a cat"], reference=[reference], target=[target], at=[at],
                     reference_piece=[reference_pieces[at] if at is not None and at < len(reference) else None],
                     target_piece=[target_pieces[at] if at is not None and at < len(target) else None])


SAME = _tokens([5, 7, 9], ["a", " c", "at"], [5, 7, 9], ["a", " c", "at"])
SPLIT = _tokens([5, 7, 9], ["a", " c", "at"], [5, 8, 11, 9], ["a", " ", "c", "at"])


def _check(tokens, target_output=None):
    exp = experiment_from_dict(tiny_experiment([{"backend": "eager", "name": "target"}],
                                               tolerances={"atol": [1e-3], "gate": 1e-3, "rtol": 0.0}))
    out = torch.tensor([1.0, 2.0])
    ref = Execution(exp.reference, "ok", outputs=[out])
    tgt = Execution(exp.targets[0], "ok", outputs=[out if target_output is None else target_output], tokens=tokens)
    return judge(ref, tgt, exp.tolerance_for(exp.targets[0]), model="m", inputs="x")


def test_the_same_ids_leave_the_verdict_to_the_logits():
    assert first_mismatch(SAME) is None and first_mismatch(None) is None
    check = _check(SAME)
    assert check.passed and check.failure_class is None


def test_other_ids_fail_with_the_first_differing_token_and_its_text():
    check = _check(SPLIT)
    assert (check.passed, check.failure_class) == (False, tx.TOKENIZER_MISMATCH)
    assert "text 0 at token 1" in check.detail
    assert "7 ' c'" in check.detail and "8 ' '" in check.detail  # each side's id and its text
    assert "on the reference's ids the logits pass" in check.detail
    assert not any(check.verdicts.values())


def test_the_logits_are_still_judged_and_said():
    check = _check(SPLIT, torch.tensor([1.0, 2.5]))
    assert check.failure_class == tx.TOKENIZER_MISMATCH
    assert "logits fail (numeric_drift" in check.detail


def test_a_shorter_side_is_named_as_ending():
    mismatch = first_mismatch(_tokens([5, 7, 9], ["a", " c", "at"], [5, 7], ["a", " c"]))
    assert (mismatch.position, mismatch.target, mismatch.lengths) == (2, None, (3, 2))
    assert "nothing (its ids end here)" in mismatch.describe()


class TokenizingBackend(Backend):
    """A backend with a tokenizer of its own that splits every id in two: what the execution asks of it."""

    def prepare(self, model, example):
        pass

    def run(self, inputs):
        return inputs.kwargs["input_ids"].float()

    def tokenize(self, texts):
        return [[1, 2] for _ in texts]

    def token_texts(self, ids):
        return [f"<{i}>" for i in ids]


def test_the_execution_tokenizes_the_texts_with_the_backends_own_tokenizer():
    from parity.execute.execution import execute

    ids = torch.tensor([[4, 6, 0]])
    inputs = Inputs((), {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 0]])}, texts=("hi there",),
                    text_ids=((4, 6),), pieces=(("hi", " there"),))
    tokens = own_tokens(TokenizingBackend(BackendSpec(backend="eager")), inputs)
    assert tokens.reference == [[4, 6]] and tokens.target == [[1, 2]]  # the text's ids, not the padded row
    assert tokens.at == [0] and tokens.reference_piece == ["hi"] and tokens.target_piece == ["<1>"]
    result = execute(BackendSpec(backend="tests.verify.test_tokenizers:TokenizingBackend"), torch.nn.Identity(), inputs,
                     repeats=2)
    assert result.ok and first_mismatch(result.tokens).position == 0


class WholeText(TokenizingBackend):
    """A tokenizer of its own that gives a text's ids as the reference's did (1 to 6)."""

    def tokenize(self, texts):
        return [[1, 2, 3, 4, 5, 6] for _ in texts]


def test_a_text_cut_into_windows_is_compared_whole_not_window_by_window():
    """A text_file's windows are rows cut from one text's ids: the backend's tokenization of the text is compared
    with those ids (`text_ids`), not with a window; the same ids are no mismatch."""
    inputs = Inputs((), {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]]), "attention_mask": torch.ones(2, 3)},
                    texts=("one text",), text_ids=((1, 2, 3, 4, 5, 6),), pieces=(("a", "b", "c", "d", "e", "f"),))
    tokens = own_tokens(WholeText(BackendSpec(backend="eager")), inputs)
    assert tokens.reference == [[1, 2, 3, 4, 5, 6]] and first_mismatch(tokens) is None


class LaterDifference(TokenizingBackend):
    """A tokenizer of its own that splits the text alike for the span the windows take (1 to 6), then differently."""

    def tokenize(self, texts):
        return [[1, 2, 3, 4, 5, 6, 9, 9] for _ in texts]


def test_a_windowed_text_is_compared_over_the_span_its_windows_take():
    """A text_file's windows take the text's first tokens (the rest dropped, `ids_cut`): a tokenizer that differs
    only further on runs the same ids as the check does, so it is no mismatch; one that differs inside is."""
    windows = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]]), "attention_mask": torch.ones(2, 3)}
    inputs = Inputs((), windows, texts=("one text",), text_ids=((1, 2, 3, 4, 5, 6),),
                    pieces=(("a", "b", "c", "d", "e", "f"),), ids_cut=True)
    assert first_mismatch(own_tokens(LaterDifference(BackendSpec(backend="eager")), inputs)) is None
    assert first_mismatch(own_tokens(TokenizingBackend(BackendSpec(backend="eager")), inputs)).position == 2  # ends inside
    whole = Inputs((), windows, texts=("one text",), text_ids=((1, 2, 3, 4, 5, 6),), pieces=(("a", "b", "c", "d", "e", "f"),))
    assert first_mismatch(own_tokens(LaterDifference(BackendSpec(backend="eager")), whole)).position == 6
