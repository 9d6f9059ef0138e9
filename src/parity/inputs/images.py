"""Images from files, globs and `sample:NAME`, with torchvision-style preprocessing.

`sample:NAME` names a photograph that ships inside scikit-image (`sample:chelsea`, `sample:coffee`,
`sample:astronaut`...), so examples and tests run offline with real pictures.
"""

from __future__ import annotations

import glob
import math
from functools import cache
from pathlib import Path

import torch

from parity.errors import ParityError, did_you_mean

SAMPLE_PREFIX = "sample:"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


@cache
def samples() -> dict[str, Path]:
    """Bundled photographs by name."""
    try:
        import skimage.data
    except ImportError:
        return {}
    folder = Path(skimage.data.__file__).parent
    return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES}


def _is_glob(ref: str) -> bool:
    return any(c in ref for c in "*?[")


def resolve_images(ref: str, base_dir: Path) -> list[Path]:
    """The files one `images:` entry names (a glob may name several, sorted)."""
    if ref.startswith(SAMPLE_PREFIX):
        name = ref[len(SAMPLE_PREFIX):]
        if name not in samples():
            raise ParityError(f"unknown sample image '{name}'{did_you_mean(name, samples())} (bundled: {', '.join(samples())})")
        return [samples()[name]]
    path = Path(ref).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if _is_glob(ref):
        found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise ParityError(f"no image matches '{ref}' (looked in {path.parent})")
        return found
    if not path.is_file():
        raise ParityError(f"image not found: {path}")
    return [path]


def image_problem(ref: str, base_dir: Path) -> str | None:
    try:
        resolve_images(ref, base_dir)
    except ParityError as exc:
        return exc.problems[0]
    return None


def preprocess_image(img: torch.Tensor, pre) -> torch.Tensor:
    """uint8 CHW -> float CHW in [0, 1], then resize, center crop, resize to a multiple, normalize."""
    from torchvision.transforms.v2 import functional as F

    x = img.float() / 255.0
    if pre.resize is not None:  # [S]: the shorter side becomes S; [H, W]: exact
        x = F.resize(x, list(pre.resize), antialias=True)
    if pre.center_crop is not None:
        x = F.center_crop(x, list(pre.center_crop))
    if pre.resize_multiple:
        m = pre.resize_multiple
        h, w = x.shape[-2:]
        size = [max(m, int(math.floor(h / m + 0.5)) * m), max(m, int(math.floor(w / m + 0.5)) * m)]
        if size != [h, w]:
            x = F.resize(x, size, antialias=True)
    if pre.mean is not None:
        if len(pre.mean) != x.shape[0]:
            raise ParityError(f"preprocess.mean has {len(pre.mean)} values but the image has {x.shape[0]} channels")
        x = F.normalize(x, mean=list(pre.mean), std=list(pre.std))
    return x.contiguous()


def image_files(refs: list[str], base_dir: Path) -> list[tuple[str, Path]]:
    """(the `images:` entry, the file) of every image an input set loads, in the order the model sees
    them: records name the files so that a report can draw on them."""
    return [(ref, path) for ref in refs for path in resolve_images(ref, base_dir)]


def load_images(refs: list[str], pre, base_dir: Path) -> list[torch.Tensor]:
    from PIL import Image
    from torchvision.transforms.v2.functional import pil_to_tensor

    tensors = []
    for _, path in image_files(refs, base_dir):
        try:
            with Image.open(path) as im:
                img = pil_to_tensor(im.convert("RGB"))
        except OSError as exc:
            raise ParityError(f"cannot read image {path}: {exc}") from exc
        tensors.append(preprocess_image(img, pre))
    return tensors
