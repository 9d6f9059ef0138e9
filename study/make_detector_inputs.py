"""The trained detector's inputs at scale (issue #27): N 320x320 RGB PNGs made from scikit-image's bundled photos.

Each image is one photo (drawn in turn, so the photos weigh alike) cropped to a random 50-100% of its shorter
side at a random place, flipped left-right at random, scaled to a random 160-320 px and padded to 320 x 320
(nudenet pads to a square, then resizes), and its brightness multiplied by a random 0.6-1.4. Seeded: the same
N and seed give the same files. `source.json` beside them names each file's photo, the unit that
study/detector_at_scale.py clusters its intervals by (images made from one photo are not independent).

    .venv/bin/python study/make_detector_inputs.py parity-out/detector-inputs --count 240
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data

PHOTOS = ("astronaut", "camera", "coffee", "chelsea", "rocket")
SIZE = 320


def photo(name: str) -> np.ndarray:
    """A bundled photo as uint8 RGB (a grayscale one repeated in three channels)."""
    pixels = getattr(data, name)()
    return np.repeat(pixels[..., None], 3, axis=2) if pixels.ndim == 2 else pixels[..., :3]


def variant(pixels: np.ndarray, rng: np.random.Generator) -> Image.Image:
    """One random crop, flip, scale and brightness of `pixels`, padded to SIZE x SIZE."""
    height, width = pixels.shape[:2]
    side = int(min(height, width) * rng.uniform(0.5, 1.0))
    top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
    crop = pixels[top:top + side, left:left + side]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    scaled = int(rng.integers(160, SIZE + 1))
    image = Image.fromarray(np.ascontiguousarray(crop)).resize((scaled, scaled), Image.BILINEAR)
    bright = np.clip(np.asarray(image, dtype=np.float32) * rng.uniform(0.6, 1.4), 0, 255).astype(np.uint8)
    canvas = Image.new("RGB", (SIZE, SIZE))
    canvas.paste(Image.fromarray(bright), (0, 0))
    return canvas


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write the PNGs and source.json to")
    parser.add_argument("--count", type=int, default=240, help="how many images (default 240: 48 per photo)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    photos = {name: photo(name) for name in PHOTOS}
    sources = {}
    for i in range(args.count):
        name = PHOTOS[i % len(PHOTOS)]
        file = f"{i:04d}.png"
        variant(photos[name], rng).save(args.out / file)
        sources[file] = name
    (args.out / "source.json").write_text(json.dumps(sources, indent=0) + "\n", encoding="utf-8")
    print(f"{args.count} images from {len(PHOTOS)} photos in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
