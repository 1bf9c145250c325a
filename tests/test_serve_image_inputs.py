"""`magmadnn serve` on a model trained from image files says what it takes (issue 46): table rows are
refused with how to send images (size, colours, scale); /metadata describes the input as images, not
pixel columns; a form's text field is named as not a file; a lone image is answered as it is in a
batch (and as `predict` answers a folder of it). Tiny models of tiny PNGs, the app driven in-process."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("PIL")

from conftest import TINY_CNN, run_train
from magmadnn_cli.commands.serve.app import Limits, app
from magmadnn_cli.commands.serve.batching import Metrics, Service
from magmadnn_cli.inference import Predictor
from test_serve_asgi import call

# (colour, PIL mode, height, width): an RGB square and a non-square grayscale model
KINDS = {"rgb": ("rgb", "RGB", 16, 16), "gray": ("grayscale", "L", 12, 8)}
CHANNELS = {"RGB": 3, "L": 1}


def _folder(root: Path, mode: str, height: int, width: int) -> Path:
    """Two class folders of six random PNGs each (the `dog`s brighter on their left half)."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, (height, width, CHANNELS[mode]), dtype=np.uint8)
            pixels[:, :width // 2] |= 0x80 if label == "dog" else 0
            Image.fromarray(pixels.squeeze(-1) if mode == "L" else pixels, mode).save(root / label / f"{i}.png")
    return root


def _model(root: Path, kind: str) -> Path:
    color, mode, height, width = KINDS[kind]
    images = _folder(root / "images", mode, height, width)
    config = root / "config.yaml"
    config.write_text(f"""name: tiny_{kind}
seed: 0
data:
  train: {images}/
  validation_split: 0.25
  image: {{size: [{height}, {width}], color: {color}}}
{TINY_CNN}""")
    result = run_train(root / "run", [], config=config)
    assert result.returncode == 0, result.stderr
    return root / "run" / "model.npz"


@pytest.fixture(scope="module", params=sorted(KINDS))
def served(request, tmp_path_factory):
    """(the ASGI app over a started model thread, the model file, its kind, its image files)."""
    model = _model(tmp_path_factory.mktemp(request.param), request.param)
    service = Service(Predictor(model, "cpu"), 1024, 0.0, Metrics())
    service.start()
    yield app(service, Limits(16.0, 30.0, None)), model, request.param, sorted(model.parent.parent.glob("images/*/*.png"))
    service.stop()


def form(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body of (field, filename or None for a text field, bytes)."""
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    for field, filename, data in parts:
        disposition = f'form-data; name="{field}"' + (f'; filename="{filename}"' if filename else "")
        kind = "Content-Type: image/png\r\n" if filename else ""
        out.write(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n{kind}\r\n".encode() + data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def post(asgi, path: str, body: bytes | str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    body = body.encode() if isinstance(body, str) else body
    status, _, answer = call(asgi, "POST", path, body, headers or {"Content-Type": "application/json"})
    return status, json.loads(answer)


def _expect_images_message(message: str, kind: str) -> None:
    color, _, height, width = KINDS[kind]
    assert "takes images" in message and f"{height}x{width}" in message and color in message, message
    assert "multipart/form-data" in message and '{"images": [' in message and "scaled" in message, message
    assert "missing feature" not in message and "pixel" not in message, message


ROWS = {  # table bodies of every form serve reads, for an image model
    "records": ('[{"age": 41, "sex": 1}]', "application/json"),
    "pixel records": (json.dumps([{f"pixel{i}": 0.5 for i in range(5)}]), "application/json"),
    "dataframe_split": ('{"dataframe_split": {"columns": ["pixel0"], "data": [[1]]}}', "application/json"),
    "dataframe_records": ('{"dataframe_records": [{"pixel0": 1}]}', "application/json"),
    "instances": ('{"instances": [{"a": 1}]}', "application/json"),
    "csv": ("pixel0,pixel1\n1,2\n", "text/csv"),
}


@pytest.mark.parametrize("body", sorted(ROWS))
def test_table_rows_to_an_image_model_say_how_to_send_images(served, body):
    asgi, _, kind, _ = served
    text, content_type = ROWS[body]
    for path in ("/predict", "/invocations"):
        status, answer = post(asgi, path, text, {"Content-Type": content_type})
        assert status == 422, answer
        _expect_images_message(answer["error"], kind)


def test_complete_pixel_rows_are_refused_too(served):
    """Rows of every pixel column are not how the model is sent images: refused alike (not guessed at)."""
    asgi, _, kind, _ = served
    _, _, height, width = KINDS[kind]
    size = CHANNELS[KINDS[kind][1]] * height * width
    status, answer = post(asgi, "/predict", json.dumps([{f"pixel{i}": 1 for i in range(size)}]))
    assert status == 422
    _expect_images_message(answer["error"], kind)


def test_metadata_describes_images_not_pixel_columns(served):
    asgi, model, kind, _ = served
    color, _, height, width = KINDS[kind]
    status, _, body = call(asgi, "GET", "/metadata")
    described = json.loads(body)
    assert status == 200 and len(described["inputs"]) == 1, described["inputs"][:3]
    image = described["inputs"][0]
    assert image["type"] == "image" and image["size"] == [height, width] and image["color"] == color
    assert image["shape"] == [CHANNELS[KINDS[kind][1]], height, width] and image["resize"] == "stretch"
    assert image["scale"] == pytest.approx(1 / 255)
    assert "multipart/form-data" in image["send"] and '{"images": [' in image["send"]
    assert "pixel0" not in body.decode()
    assert described["outputs"]["labels"] == ["cat", "dog"]


def test_a_text_field_is_not_a_file_upload(served):
    asgi, _, _, images = served
    status, answer = post(asgi, "/predict", *form([("x", None, b"1")]))
    assert status == 422 and "part 1 (x) is not a file upload" in answer["error"], answer
    assert "cannot be decoded" not in answer["error"] and "-F file=@" in answer["error"]
    status, answer = post(asgi, "/predict", *form([("file", "a.png", images[0].read_bytes()), ("note", None, b"hi")]))
    assert status == 422 and "part 2 (note) is not a file upload" in answer["error"], answer
    status, answer = post(asgi, "/predict", *form([("file", "a.png", images[0].read_bytes())]))
    assert status == 200, answer  # a file under any field name is a file


def _predicted(model: Path, folder: Path) -> list[list[float]]:
    """`magmadnn predict MODEL FOLDER --proba`'s probabilities (one BLAS thread, as the tests serve)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "magmadnn_cli", "predict", str(model), str(folder), "--proba"],
                         capture_output=True, text=True, check=True, env=env).stdout
    return [[float(v) for v in row[2:]] for row in list(csv.reader(io.StringIO(out)))[1:]]


def _probabilities(answer: dict) -> list[list[float]]:
    return [list(row.values())[1:] for row in answer["predictions"]]


README = Path(__file__).resolve().parents[1] / "README.md"
RTOL, ATOL = 1e-5, 1e-6  # the float32 tolerance the README's serve section states


def test_a_lone_image_agrees_with_predict_to_the_stated_tolerance(served):
    """A batch of the folder's images is `predict`'s answer to the digit (the same batch shape); each
    image alone (the network on one row: another summation order) within the README's tolerance."""
    asgi, model, _, images = served
    section = README.read_text().split("### Serving over HTTP")[1].split("\n## ")[0]
    assert "numpy.allclose(rtol=1e-5, atol=1e-6)" in section
    folder = images[0].parent.parent
    expected = _predicted(model, folder)
    encoded = [base64.b64encode(f.read_bytes()).decode() for f in sorted(folder.glob("*/*.png"))]
    status, batch = post(asgi, "/predict?proba=true", json.dumps({"images": encoded}))
    assert status == 200 and _probabilities(batch) == expected
    alone = []
    for data in encoded:
        status, answer = post(asgi, "/predict?proba=true", json.dumps({"images": [data]}))
        assert status == 200, answer
        alone += _probabilities(answer)
    np.testing.assert_allclose(np.array(alone), np.array(expected), rtol=RTOL, atol=ATOL)
