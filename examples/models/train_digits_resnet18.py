"""Train torchvision's ResNet-18 on scikit-learn's bundled digits (nothing is downloaded), for
examples/int8_trained.yaml: an int8 target of a *trained* model, whose top-1 margins are a real classifier's
(a seeded random init's logits are so far apart that int8 never flips a decision).

The 1,797 8x8 digits (0-16) are scaled to 0-255, upscaled bilinearly to 32x32 and written as 8-bit grayscale
PNG files; parity reads them as RGB in [0, 1] (the three channels alike), exactly the tensors the model is trained
on, so no preprocessing is needed. A seeded split: 1,297 images to train on, 500 held out. Writes into OUT
(default parity-out/digits, relative to the current folder):

- resnet18_digits.pt: the state_dict (`source: torchvision, builder: resnet18, params: {num_classes: 10},
  weights: ...`);
- heldout/NNNN_dD.png: the 500 held-out images (D: the true digit), the input set int8 is judged on;
- calibration/NNNN.png: 64 training images, the int8 target's calibration set (never judged on);
- train.json: seed, epochs, the held-out accuracy and how long training took.

Seeded and deterministic (torch.use_deterministic_algorithms); about a minute on 2 CPU cores.
Run: `python examples/models/train_digits_resnet18.py [--out DIR] [--epochs N]`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

SIZE = 32  # ResNet-18's stem and four stages take 32x32 down to 1x1
HELD_OUT = 500
CALIBRATION = 64


def digit_images(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 images [N, 32, 32], labels [N], a seeded permutation of range(N))."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise SystemExit("this script needs scikit-learn (its digits ship in the wheel): pip install scikit-learn") from exc
    digits = load_digits()
    small = torch.from_numpy(digits.images).float()[:, None] * (255.0 / 16.0)
    large = F.interpolate(small, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    images = large.round().clamp(0, 255).to(torch.uint8)[:, 0].numpy()
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed)).numpy()
    return images, digits.target.astype(np.int64), order


def as_batch(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W] -> float32 [N, 3, H, W] in [0, 1]: what parity makes of the 8-bit grayscale PNG files."""
    return (torch.from_numpy(images).float() / 255.0)[:, None].expand(-1, 3, -1, -1).contiguous()


def train(x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    steps_per_epoch = (len(x) + 63) // 64
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=epochs * steps_per_epoch)
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(epochs):
        order, total = torch.randperm(len(x), generator=shuffle), 0.0
        for start in range(0, len(x), 64):
            batch = order[start:start + 64]
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss) * len(batch)
        print(f"epoch {epoch + 1}/{epochs}: loss {total / len(x):.4f}", flush=True)
    return model.eval()


def write_pngs(folder: Path, images: np.ndarray, names: list[str]) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for image, name in zip(images, names, strict=True):
        Image.fromarray(image, mode="L").save(folder / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="parity-out/digits", help="the folder to write into (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    out = Path(args.out)
    images, labels, order = digit_images(args.seed)
    test, train_idx = order[:HELD_OUT], order[HELD_OUT:]
    start = time.perf_counter()
    model = train(as_batch(images[train_idx]), torch.from_numpy(labels[train_idx]), args.epochs, args.seed)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        predicted = model(as_batch(images[test])).argmax(1).numpy()
    accuracy = float((predicted == labels[test]).mean())
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "resnet18_digits.pt")
    write_pngs(out / "heldout", images[test], [f"{i:04d}_d{labels[j]}.png" for i, j in enumerate(test)])
    calibration = train_idx[:CALIBRATION]
    write_pngs(out / "calibration", images[calibration], [f"{i:04d}.png" for i in range(len(calibration))])
    summary = {"seed": args.seed, "epochs": args.epochs, "train_images": len(train_idx), "held_out": HELD_OUT,
               "held_out_accuracy": accuracy, "train_seconds": round(seconds, 1), "threads": torch.get_num_threads()}
    (out / "train.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"held-out accuracy {accuracy:.4f} ({HELD_OUT} images); trained in {seconds:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
