"""Images from files, globs and `sample:NAME`, with torchvision-style preprocessing.

`sample:NAME` names a photograph that ships inside scikit-image (`sample:chelsea`, `sample:coffee`,
`sample:astronaut`...), so examples and tests run offline with real pictures.

Every image becomes float32 RGB in [0, 1], by the range of what its file holds (`MODES`): 8-bit modes
through Pillow's conversion to RGB and /255, 16-bit grayscale /65535, 32-bit integer grayscale by the
int32 range, 32-bit float grayscale as it is when it lies in [0, 1]. Anything else is refused with the
file and its mode: an image read with the wrong scale becomes a constant tensor (a 16-bit PNG clipped
to 8 bits is all 1.0) on which every backend agrees, which is a pass on garbage. An image whose values
are all the same is warned about for the same reason.

Sizes are checked from the file's header before anything is decoded or resized: the image itself and
every preprocessing step hold at most `MAX_ELEMENTS` values (a 1 x 100000 strip resized to a shorter
side of 256 would need 78 GB), and an input set at most that many together.

Globs are walked here rather than by `glob`, so that a walk is bounded: at most `MAX_GLOB_ENTRIES`
folder entries looked at and `MAX_GLOB_SECONDS` spent (`/proc/**/*.png` would take minutes), at most
`MAX_IMAGES` matches; anything but a regular file (a FIFO, whose opening would wait for ever, a
device, a socket) is skipped. As with `glob`, `*` does not match a leading dot; `**` does not follow
links to folders (a link loop cannot make it endless).
"""

from __future__ import annotations

import fnmatch
import math
import os
import time
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from parity.config.schema import MAX_ELEMENTS
from parity.errors import ParityError, did_you_mean
from parity.files import file_problem, is_regular, user_path

SAMPLE_PREFIX = "sample:"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
MAX_IMAGES = 10_000  # images in one input set
MAX_GLOB_ENTRIES = 200_000  # folder entries one glob may look at
MAX_GLOB_SECONDS = 10.0
CHANNELS = 3

# Pillow mode -> how its values reach [0, 1]. "rgb8": Pillow's own conversion to 8-bit RGB, then /255.
EIGHT_BIT = ("1", "L", "P", "PA", "LA", "RGB", "RGBA", "RGBX", "RGBa", "CMYK", "YCbCr", "LAB", "HSV")
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
MODES = {**{m: "rgb8" for m in EIGHT_BIT}, **{m: "uint16" for m in SIXTEEN_BIT}, "I": "int32", "F": "float"}


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


def _hidden_ok(pattern: str, name: str) -> bool:
    return not name.startswith(".") or pattern.startswith(".")


class _Walk:
    """One bounded glob: counts the folder entries it looks at and the time it takes."""

    def __init__(self, ref: str):
        self.ref, self.entries, self.deadline = ref, 0, time.monotonic() + MAX_GLOB_SECONDS

    def scan(self, folder: str) -> list[os.DirEntry]:
        try:
            with os.scandir(folder or ".") as it:
                found = []
                for entry in it:
                    self.entries += 1
                    if self.entries > MAX_GLOB_ENTRIES or time.monotonic() > self.deadline:
                        raise ParityError(
                            f"'{self.ref}': the glob looked at more than {MAX_GLOB_ENTRIES} entries or for more "
                            f"than {MAX_GLOB_SECONDS:g} s without finishing; name a narrower folder")
                    found.append(entry)
                return found
        except OSError:  # unreadable or vanished: glob skips it too
            return []

    def match(self, folder: str, parts: list[str]) -> list[str]:
        if not parts:
            return [folder]
        part, rest = parts[0], parts[1:]
        if part == "**":
            out = self.match(folder, rest)
            for entry in self.scan(folder):
                if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                    out += self.match(entry.path, parts)
            return out
        if not _is_glob(part):
            path = os.path.join(folder, part)
            return self.match(path, rest) if os.path.lexists(path) else []
        out = []
        for entry in self.scan(folder):
            if fnmatch.fnmatchcase(entry.name, part) and _hidden_ok(part, entry.name):
                out += self.match(entry.path, rest)
        return out


def _glob(ref: str, path: Path) -> list[Path]:
    anchor, *parts = path.parts
    found = _Walk(ref).match(anchor, parts)
    images = sorted({Path(p) for p in found if Path(p).suffix.lower() in IMAGE_SUFFIXES and is_regular(p)})
    if len(images) > MAX_IMAGES:
        raise ParityError(f"'{ref}' matches {len(images)} images; an input set holds at most {MAX_IMAGES}")
    return images


def resolve_images(ref: str, base_dir: Path) -> list[Path]:
    """The files one `images:` entry names (a glob may name several, sorted; only regular files)."""
    if ref.startswith(SAMPLE_PREFIX):
        name = ref[len(SAMPLE_PREFIX):]
        if name not in samples():
            raise ParityError(f"unknown sample image '{name}'{did_you_mean(name, samples())} (bundled: {', '.join(samples())})")
        return [samples()[name]]
    path = user_path(ref, "image")
    path = path if path.is_absolute() else base_dir / path
    if _is_glob(ref):
        found = _glob(ref, path)
        if not found:
            raise ParityError(f"no image matches '{ref}' (looked in {path.parent})")
        return found
    problem = file_problem(path, "image")
    if problem:
        raise ParityError(problem)
    return [path]


@dataclass(frozen=True)
class ImageHeader:
    """What an image file says of itself before it is decoded."""

    path: Path
    mode: str
    height: int
    width: int


def read_header(path: Path) -> ImageHeader:
    """The mode and size of an image file, refused when parity cannot scale its mode into [0, 1]."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # sizes are bounded below
            with Image.open(path) as im:
                header = ImageHeader(path, im.mode, im.height, im.width)
    except Image.DecompressionBombError as exc:
        raise ParityError(f"image {path}: too large to decode ({exc})") from exc
    except Exception as exc:  # UnidentifiedImageError, truncated headers, decoder errors
        raise ParityError(f"cannot read image {path}: {type(exc).__name__}: {exc}") from exc
    if header.mode not in MODES:
        raise ParityError(f"image {path}: mode {header.mode} cannot be scaled into [0, 1] (parity reads modes "
                          f"{', '.join(MODES)}); convert it to 8-bit RGB or 16-bit grayscale")
    return header


def _resized(h: int, w: int, resize: list[int]) -> tuple[int, int]:
    """torchvision's resize: [S] makes the shorter side S and scales the longer one (rounded down)."""
    if len(resize) == 2:
        return resize[0], resize[1]
    if h <= w:
        return resize[0], int(resize[0] * w / h)
    return int(resize[0] * h / w), resize[0]


def _multiple(h: int, w: int, m: int) -> tuple[int, int]:
    return max(m, int(math.floor(h / m + 0.5)) * m), max(m, int(math.floor(w / m + 0.5)) * m)


def planned_size(header: ImageHeader, pre) -> tuple[int, int]:
    """The image's size after preprocessing, checked step by step against MAX_ELEMENTS before any of
    them allocates."""
    h, w = header.height, header.width
    steps = [("the decoded image", h, w)]
    if pre.resize is not None:
        h, w = _resized(h, w, list(pre.resize))
        steps.append((f"resize {list(pre.resize)}", h, w))
    if pre.center_crop is not None:
        crop = list(pre.center_crop)
        h, w = (crop[0], crop[0]) if len(crop) == 1 else (crop[0], crop[1])
        steps.append((f"center_crop {crop}", h, w))
    if pre.resize_multiple:
        h, w = _multiple(h, w, pre.resize_multiple)
        steps.append((f"resize_multiple {pre.resize_multiple}", h, w))
    for step, sh, sw in steps:
        values = CHANNELS * sh * sw
        if values > MAX_ELEMENTS:
            raise ParityError(
                f"image {header.path} ({header.width} x {header.height}): {step} would hold {CHANNELS} x {sh} x {sw} "
                f"= {values} values ({values * 4 / 1e9:.1f} GB as float32), more than parity builds "
                f"({MAX_ELEMENTS} per input set)")
    return h, w


def _scaled(im, header: ImageHeader) -> torch.Tensor:
    """float32 CHW RGB in [0, 1], by the range of the mode's values."""
    import numpy as np

    kind = MODES[header.mode]
    if kind == "rgb8":
        return torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    values = np.asarray(im)
    if kind == "uint16":
        gray = values.astype(np.float32) / 65535.0
    elif kind == "int32":
        if values.min() < 0:
            raise ParityError(f"image {header.path}: mode I (32-bit integers) holds negative values "
                              f"(down to {int(values.min())}); parity reads images into [0, 1]")
        gray = (values.astype(np.float64) / np.iinfo(np.int32).max).astype(np.float32)
    else:
        gray = values.astype(np.float32)
        if not np.isfinite(gray).all() or gray.min() < 0 or gray.max() > 1:
            low, high = float(np.nanmin(gray)), float(np.nanmax(gray))
            raise ParityError(f"image {header.path}: mode F (32-bit floats) holds values from {low:g} to {high:g}"
                              f"{' and NaN or Inf' if not np.isfinite(gray).all() else ''}; parity reads float "
                              "images as they are, so their values must lie in [0, 1]")
    return torch.from_numpy(np.ascontiguousarray(gray)).unsqueeze(0).expand(CHANNELS, -1, -1)


def read_image(header: ImageHeader) -> torch.Tensor:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(header.path) as im:
                return _scaled(im, header).contiguous()
    except ParityError:
        raise
    except Exception as exc:  # a truncated or damaged file fails when decoded, not when opened
        raise ParityError(f"cannot read image {header.path}: {type(exc).__name__}: {exc}") from exc


def image_problem(ref: str, base_dir: Path, pre) -> str | None:
    """What `parity validate` says of one `images:` entry, from the files' headers alone: they are
    regular files, in a mode parity can scale, whose preprocessing fits the size bound."""
    try:
        for path in resolve_images(ref, base_dir):
            planned_size(read_header(path), pre)
    except ParityError as exc:
        return exc.problems[0]
    return None


def preprocess_image(x: torch.Tensor, pre) -> torch.Tensor:
    """float CHW in [0, 1] -> resize, center crop, resize to a multiple, normalize."""
    from torchvision.transforms.v2 import functional as F

    if pre.resize is not None:  # [S]: the shorter side becomes S; [H, W]: exact
        x = F.resize(x, list(pre.resize), antialias=True)
    if pre.center_crop is not None:
        x = F.center_crop(x, list(pre.center_crop))
    if pre.resize_multiple:
        size = list(_multiple(*x.shape[-2:], pre.resize_multiple))
        if size != list(x.shape[-2:]):
            x = F.resize(x, size, antialias=True)
    if pre.mean is not None:
        if len(pre.mean) != x.shape[0]:
            raise ParityError(f"preprocess.mean has {len(pre.mean)} values but the image has {x.shape[0]} channels")
        x = F.normalize(x, mean=list(pre.mean), std=list(pre.std))
    return x.contiguous()


def image_files(refs: list[str], base_dir: Path) -> list[tuple[str, Path]]:
    """(the `images:` entry, the file) of every image an input set loads, in the order the model sees
    them: records name the files so that a report can draw on them."""
    files = [(ref, path) for ref in refs for path in resolve_images(ref, base_dir)]
    if len(files) > MAX_IMAGES:
        raise ParityError(f"the input set names {len(files)} images; it holds at most {MAX_IMAGES}")
    return files


def constant_value(x: torch.Tensor) -> float | None:
    """The value every element of `x` has, or None when they differ (or there is only one)."""
    if x.numel() < 2:
        return None
    low, high = x.min(), x.max()  # two reductions, no mask the size of x
    return float(low) if bool(low == high) else None


def load_images(refs: list[str], pre, base_dir: Path) -> tuple[list[torch.Tensor], list[str]]:
    """The preprocessed images, and a warning for each image whose values are all the same."""
    tensors, notes, total = [], [], 0
    for _, path in image_files(refs, base_dir):
        header = read_header(path)
        h, w = planned_size(header, pre)
        total += CHANNELS * h * w
        if total > MAX_ELEMENTS:
            raise ParityError(f"image {path}: the input set's images would hold {total} values after "
                              f"preprocessing, more than parity builds ({MAX_ELEMENTS} per input set)")
        x = read_image(header)
        value = constant_value(x)
        if value is not None:
            notes.append(f"image {path} (mode {header.mode}, {header.width} x {header.height}): every value is "
                         f"{value:g}, a constant input on which any backend agrees; check the file")
        tensors.append(preprocess_image(x, pre))
    return tensors, notes
