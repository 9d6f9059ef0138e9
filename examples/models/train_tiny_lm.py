"""Train a small LLaMA-architecture language model on text an installed package bundles (nothing is downloaded), for
examples/llm.yaml: a *trained* decoder, whose next-token distributions are peaked where the text is predictable
and near ties where it is not, as a deployed language model's are (a seeded random init's are flat everywhere).

The text: the 21,844 WordNet glosses timm ships for ImageNet-21k's classes
(`timm/data/_info/imagenet_synset_to_definition.txt`, one English definition a line: "a living thing that has
(or can develop) the ability to act or function independently"). Every tenth gloss is held out (never trained
on): examples/llm.yaml's sentences are among them. A word-level tokenizer (lower case; words and punctuation;
the 1,000 most frequent words of the training glosses, the others [UNK]) is saved with the model.

Writes into OUT (default parity-out/tiny-lm, relative to the current folder):
- model/: the decoder (LLaMA's blocks: RMSNorm, rotary positions, SwiGLU; 4 layers, width 64, 4 heads, every
  projection an nn.Linear, which weight-only quantization takes), as save_pretrained writes it
  (`source: transformers, path: .../model, architecture: LlamaForCausalLM`);
- tokenizer/: its tokenizer, as save_pretrained writes it (`text:` input sets read it with `tokenizer:`);
- train.json: seed, steps, the held-out perplexity and how long training took.

Seeded and deterministic (torch.use_deterministic_algorithms, two threads); a few minutes on 2 CPU cores.
Run: `python examples/models/train_tiny_lm.py [--out DIR] [--steps N]`.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import time
from pathlib import Path

import torch

VOCAB = 1000
CONTEXT = 32  # tokens per training sequence
SPECIAL = ["[PAD]", "[UNK]", "[EOS]"]
WORD = re.compile(r"\w+|[^\w\s]+")


def glosses() -> list[str]:
    """The WordNet glosses timm bundles, in file order."""
    try:
        import timm
    except ImportError as exc:
        raise SystemExit("the training text is timm's bundled glosses: pip install 'parity[timm]'") from exc
    path = Path(timm.__file__).parent / "data" / "_info" / "imagenet_synset_to_definition.txt"
    return [line.split("\t", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line]


def make_tokenizer(train: list[str]):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    counts = collections.Counter(w for text in train for w in WORD.findall(text.lower()))
    words = SPECIAL + [w for w, _ in counts.most_common(VOCAB - len(SPECIAL))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+|[^\w\s]+, as WORD
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]",
                                   model_input_names=["input_ids", "attention_mask"])


def stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Every text's ids followed by [EOS], one long int64 stream."""
    eos = tokenizer.convert_tokens_to_ids("[EOS]")
    return torch.tensor([i for ids in tokenizer(texts)["input_ids"] for i in [*ids, eos]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("parity-out/tiny-lm"))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import transformers

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    texts = glosses()
    train = [t for i, t in enumerate(texts) if i % 10]
    heldout = [t for i, t in enumerate(texts) if i % 10 == 0]
    tokenizer = make_tokenizer(train)
    data, held = stream(tokenizer, train), stream(tokenizer, heldout)
    config = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=64, hidden_size=64,
                                      intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=4, bos_token_id=2, eos_token_id=2, pad_token_id=0,
                                      use_cache=False, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.steps)
    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        offsets = torch.randint(0, len(data) - CONTEXT - 1, (16,), generator=generator)
        batch = torch.stack([data[o:o + CONTEXT] for o in offsets.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 250 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        chunks = held[: len(held) // CONTEXT * CONTEXT].view(-1, CONTEXT)[:512]
        perplexity = math.exp(model(input_ids=chunks, labels=chunks).loss.item())
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out / "model")
    tokenizer.save_pretrained(args.out / "tokenizer")
    info = {"seed": args.seed, "steps": args.steps, "train_glosses": len(train), "heldout_glosses": len(heldout),
            "train_tokens": len(data), "heldout_perplexity": round(perplexity, 2), "train_seconds": round(seconds, 1)}
    (args.out / "train.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
