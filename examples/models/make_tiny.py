"""Regenerate the tiny model files of the examples (examples/onnx_file.yaml, examples/saved_files.yaml,
examples/bert_saved.yaml): tests/fixtures/tiny.py's TinyCNN with seed 0, for a batch of 2 RGB 16x16 images,
saved as

- tiny_cnn.onnx: ONNX (input `x`, output `logits`), by the TorchScript exporter at opset 17: onnx2torch
  cannot convert the dynamo exporter's opset-18 ReduceMean;
- tiny_cnn.pt: TorchScript (torch.jit.trace, then torch.jit.save);
- tiny_cnn.pt2: torch.export (torch.export.export, then torch.export.save);

and a two-layer BERT sentence classifier with seed 0 as transformers saves one (tiny_bert/, save_pretrained)
with a word-level BERT tokenizer over the words of the example's sentences (tiny_bert_tokenizer/).

Run from the repository root: `python examples/models/make_tiny.py`.
"""

import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for tests/fixtures/tiny.py

from tests.fixtures.tiny import TinyCNN  # noqa: E402


def main() -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's and tracer's deprecation notices
        torch.onnx.export(model, (x,), str(HERE / "tiny_cnn.onnx"), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"])
        torch.jit.save(torch.jit.trace(model, (x,)), str(HERE / "tiny_cnn.pt"))
        torch.export.save(torch.export.export(model, (x,)), str(HERE / "tiny_cnn.pt2"))
    for name in ("tiny_cnn.onnx", "tiny_cnn.pt", "tiny_cnn.pt2"):
        print(f"{HERE / name}: {(HERE / name).stat().st_size} bytes")
    save_tiny_bert()


WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "table", "quickly", "slowly", "."]


def save_tiny_bert() -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=5 + len(WORDS), max_position_embeddings=32, num_labels=3)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(HERE / "tiny_bert")
    vocab = HERE / "tiny_bert_tokenizer" / "vocab.txt"
    vocab.parent.mkdir(exist_ok=True)
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(HERE / "tiny_bert_tokenizer")
    for path in sorted([*(HERE / "tiny_bert").iterdir(), *vocab.parent.iterdir()]):
        print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
