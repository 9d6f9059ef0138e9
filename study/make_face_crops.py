"""Write the face crops study/trained.yaml gives MTCNN's R-Net and O-Net (study/faces/*.png).

The crops are what the cascade itself gives its second and third stages: the full MTCNN (facenet-pytorch,
eager float32) finds the face in each of scikit-image's bundled photographs that has one (astronaut,
camera), and the box is made square around its centre, as MTCNN does before it resizes a candidate to
24x24 or 48x48. They are kept at their own size; the experiment resizes them.

    PYTHONPATH=/tmp/site-trained-pkgs python study/make_face_crops.py   # prints each box and its score
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data

PHOTOS = ("astronaut", "camera")
OUT = Path(__file__).resolve().parent / "faces"


def square(box) -> tuple[int, int, int, int]:
    """The square of the box's longer side around its centre, in whole pixels."""
    x0, y0, x1, y1 = (float(v) for v in box)
    side = max(x1 - x0, y1 - y0)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    left, top = round(cx - side / 2), round(cy - side / 2)
    return left, top, left + round(side), top + round(side)


def main() -> None:
    from facenet_pytorch import MTCNN

    detector = MTCNN(keep_all=False, device="cpu")
    OUT.mkdir(exist_ok=True)
    for name in PHOTOS:
        image = Image.fromarray(np.asarray(getattr(data, name)())).convert("RGB")
        boxes, scores = detector.detect(image)
        crop = square(boxes[0])
        image.crop(crop).save(OUT / f"{name}_face.png")
        print(f"{name}: box {[round(float(v), 1) for v in boxes[0]]} score {float(scores[0]):.4f} -> crop {crop}")


if __name__ == "__main__":
    main()
