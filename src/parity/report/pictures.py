"""Detection pictures: reference and target boxes side by side on the image the model saw.

The boxes come from the tier-3 check record (`pictures`); the image is read from the file the record
names and brought to the model's view with the record's preprocessing geometry (resize, center crop,
resize to a multiple; normalization does not move pixels). A file that is gone leaves a blank canvas of
the recorded size, and the caption says so. Records are data, maybe edited: a path that is not a regular file
(a FIFO would block the report forever) is not opened, a picture Pillow calls a decompression bomb is not
decoded, and no size a record gives makes a canvas over MAX_SIDE pixels a side.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from parity.files import file_problem
from parity.records.models import DetectionPictures, DrawnDetections, PictureGeometry, PictureImage
from parity.report.plots import data_uri

MAX_SIDE = 4096  # pixels a side of a drawn picture, whatever a record says
LABELLED = 5  # boxes per panel that get a "label score" tag: the highest scores


def _resize_shorter(img, size: int):
    w, h = img.size
    if h <= w:
        return img.resize((int(size * w / h), size))
    return img.resize((size, int(size * h / w)))


def _geometry(img, preprocess: PictureGeometry):
    """torchvision's resize and center-crop semantics (see parity.inputs.images.preprocess_image)."""
    resize, crop, multiple = preprocess.resize, preprocess.center_crop, preprocess.resize_multiple
    if resize:
        img = _resize_shorter(img, resize[0]) if len(resize) == 1 else img.resize((resize[1], resize[0]))
    if crop:
        th, tw = (crop[0], crop[0]) if len(crop) == 1 else crop
        w, h = img.size
        top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
        img = img.crop((left, top, left + tw, top + th))  # PIL pads with black outside, as torchvision does
    if multiple:
        w, h = img.size
        size = (max(multiple, int(math.floor(w / multiple + 0.5)) * multiple),
                max(multiple, int(math.floor(h / multiple + 0.5)) * multiple))
        if size != (w, h):
            img = img.resize(size)
    return img


def model_view(image: PictureImage, preprocess: PictureGeometry | None, boxes: list[list[float | None]]):
    """The picture as the model saw it (an RGB array) and a note when it could not be read."""
    import numpy as np
    from PIL import Image

    size = _size(image.size)
    path = image.path
    note = None
    problem = file_problem(Path(path), "picture") if path else None
    if path and not problem:
        try:
            with Image.open(path) as im:
                geometry = preprocess if preprocess is not None and _bounded(preprocess) else PictureGeometry()
                picture = _geometry(im.convert("RGB"), geometry)
            if size and list(picture.size[::-1]) != list(size):
                picture = picture.resize((size[1], size[0]))
            return np.asarray(picture), None
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            note = f"cannot read {path} ({type(exc).__name__}); boxes drawn on a blank canvas"
    elif problem:
        note = f"cannot read {path} ({problem}); boxes drawn on a blank canvas"
    else:
        note = "synthetic input: boxes drawn on a blank canvas"
    if not size:
        extent = [b for b in boxes if b and len(b) == 4 and all(isinstance(v, int | float) and math.isfinite(v) for v in b)]
        size = [min(MAX_SIDE, max(1, int(max([b[3] for b in extent], default=64)) + 1)),
                min(MAX_SIDE, max(1, int(max([b[2] for b in extent], default=64)) + 1))]
    return np.full((size[0], size[1], 3), 235, dtype=np.uint8), note


def _bounded(preprocess: PictureGeometry) -> bool:
    """Whether every size of a record's preprocessing is one a picture can have (an edited record may say 10**12)."""
    values = [*(preprocess.resize or []), *(preprocess.center_crop or [])]
    values += [preprocess.resize_multiple] if preprocess.resize_multiple else []
    return all(0 < v <= MAX_SIDE for v in values)


def _size(size: Any) -> list[int] | None:
    """A record's (height, width), when it is one a picture can have; else None (the boxes size the canvas)."""
    if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and 0 < v <= MAX_SIDE for v in size):
        return size
    return None


def _draw(ax, picture, detections: DrawnDetections, colours, under: DrawnDetections | None = None) -> None:
    from matplotlib.patches import Rectangle

    ax.imshow(picture)
    ax.set_axis_off()
    if under is not None:  # the reference's boxes, faint, under the target's: what moved shows
        for box in under.boxes:
            if box and all(v is not None for v in box):
                ax.add_patch(Rectangle((box[0], box[1]), box[2] - box[0], box[3] - box[1], fill=False,
                                       edgecolor="white", linestyle="--", linewidth=0.8, alpha=0.9))
    for k, (box, label, score) in enumerate(zip(detections.boxes, detections.labels, detections.scores, strict=True)):
        if not box or any(v is None for v in box):
            continue
        colour = colours(label % 10)
        ax.add_patch(Rectangle((box[0], box[1]), box[2] - box[0], box[3] - box[1], fill=False, edgecolor=colour,
                               linewidth=1.6 if k < LABELLED else 0.8))
        height, width = picture.shape[:2]
        seen = box[2] > 0 and box[3] > 0 and box[0] < width and box[1] < height
        if k < LABELLED and score is not None and seen:  # the tag goes where the box meets the picture
            ax.text(max(box[0], 0), max(box[1], 0), f"{label} {score:.2f}", fontsize=7, color="white", va="top",  # inside the box
                    bbox={"facecolor": colour, "edgecolor": "none", "pad": 1.0, "alpha": 0.85}, clip_on=True)


def _caption(side: str, detections: DrawnDetections) -> str:
    shown, total = len(detections.boxes), detections.total
    return f"{side}: {total} box{'es' if total != 1 else ''}" + (f" (top {shown} by score drawn)" if shown < total else "")


def side_by_side(pictures: DetectionPictures, index: int, target_name: str) -> tuple[str, str | None]:
    """One PNG with the reference's boxes (left) and the target's (right, over the reference's in dashed
    white) on image `index`; and a note when the image itself could not be shown."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    ref, tgt = pictures.reference[index], pictures.target[index]
    picture, note = model_view(pictures.images[index], pictures.preprocess, ref.boxes + tgt.boxes)
    h, w = picture.shape[:2]
    panel_w = 4.4
    fig = Figure(figsize=(2 * panel_w, panel_w * h / w + 0.45), layout="constrained")
    left, right = fig.subplots(1, 2)
    colours = colormaps.get_cmap("tab10")
    _draw(left, picture, ref, colours)
    _draw(right, picture, tgt, colours, under=ref)
    left.set_title(_caption("reference", ref), fontsize=9)
    right.set_title(_caption(target_name, tgt), fontsize=9)
    return data_uri(fig, "png", dpi=110, tight=True), note


def image_label(image: PictureImage) -> str:
    path = image.path
    return image.source + (f" ({Path(path).name})" if path and Path(path).name not in image.source else "")
