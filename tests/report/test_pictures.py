"""report/pictures.py reads a detection's pictures as typed parts: the geometry that took the file to the model's view,
each side's caption."""

from __future__ import annotations

from parity.records.models import DrawnDetections, PictureGeometry, PictureImage
from parity.report.pictures import _caption, image_label, model_view


def test_the_preprocessing_geometry_brings_the_file_to_the_models_view(tmp_path):
    from PIL import Image

    path = tmp_path / "wide.png"
    Image.new("RGB", (100, 50), "red").save(path)
    image = PictureImage(source="wide.png", path=str(path))
    assert model_view(image, PictureGeometry(resize=[20]), [])[0].shape == (20, 40, 3)  # the shorter side
    assert model_view(image, PictureGeometry(resize=[20], center_crop=[10]), [])[0].shape == (10, 10, 3)
    assert model_view(image, PictureGeometry(resize=[30, 60], resize_multiple=32), [])[0].shape == (32, 64, 3)
    assert model_view(image, None, [])[0].shape == (50, 100, 3)
    assert image_label(PictureImage(source="photos/*.png", path=str(path))) == "photos/*.png (wide.png)"


def test_a_caption_says_how_many_boxes_were_found_and_drawn():
    drawn = DrawnDetections(boxes=[[0.0, 0.0, 1.0, 1.0]] * 2, labels=[1, 2], scores=[0.9, 0.5], total=7)
    assert _caption("reference", drawn) == "reference: 7 boxes (top 2 by score drawn)"
    assert _caption("t", DrawnDetections(boxes=[[0.0, 0.0, 1.0, 1.0]], labels=[1], scores=[0.9], total=1)) == "t: 1 box"
