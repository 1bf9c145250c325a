"""`magmadnn serve` on an image model (configs/digits_folder.yaml, trained on datasets/digits_png):
image files as multipart/form-data or base64 in JSON, answered as `magmadnn predict` answers the
same files; a file that is not an image, and images sent to a table model, are answers with the fix."""

from __future__ import annotations

import base64
import csv
import io
import os
import shutil
import subprocess
import sys
import uuid

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("PIL")

from conftest import ROOT, run_train
from test_serve import Server, assert_same
from serve_helpers import train_models

IMAGES = sorted((ROOT / "datasets" / "digits_png").glob("*/*.png"))[::170][:8]  # a few of several classes


def multipart(files: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body of files (field `file`), and its Content-Type."""
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    for name, data in files:
        out.write(f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
                  "Content-Type: image/png\r\n\r\n".encode() + data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


@pytest.fixture(scope="module")
def folder_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("folder")
    result = run_train(folder / "run", ["training.epochs=1"], config=ROOT / "configs" / "digits_folder.yaml")
    assert result.returncode == 0, result.stderr
    return folder / "run" / "model.npz"


@pytest.fixture(scope="module")
def server(folder_model):
    server = Server(folder_model)
    yield server
    assert server.stop() == 0, "".join(server.said)


def predict_images(model, tmp_path) -> list[list[str]]:
    """`magmadnn predict MODEL FOLDER --proba` on the images, path column left out."""
    for i, image in enumerate(IMAGES):
        shutil.copy(image, tmp_path / f"{i:02d}.png")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # as the server runs: one BLAS
    out = subprocess.run([sys.executable, "-m", "magmadnn_cli", "predict", str(model), str(tmp_path), "--proba"],
                         capture_output=True, text=True, check=True, env=env).stdout  # thread, the same sums
    return [row[1:] for row in csv.reader(io.StringIO(out))][1:]


def test_image_files_answer_as_predict_does(server, folder_model, tmp_path):
    expected = predict_images(folder_model, tmp_path)
    files = [(f"{i:02d}.png", image.read_bytes()) for i, image in enumerate(IMAGES)]
    body, kind = multipart(files)
    status, answer = server.post("/predict?proba=true", body, kind)
    assert status == 200, answer
    assert_same(answer["predictions"], expected)
    status, answer = server.post("/invocations?proba=true", {"images": [base64.b64encode(d).decode() for _, d in files]})
    assert status == 200, answer
    assert_same(answer["predictions"], expected)
    status, answer = server.post("/predict", *multipart(files[:1]))
    assert answer["predictions"] == [int(expected[0][0])]


def test_a_file_that_is_not_an_image_is_named(server):
    body, kind = multipart([("a.png", IMAGES[0].read_bytes()), ("notes.png", b"not an image")])
    status, answer = server.post("/predict", body, kind)
    assert status == 422 and "image 2 (notes.png)" in answer["error"] and "cannot be decoded" in answer["error"]
    status, answer = server.post("/predict", {"images": ["%%%"]})
    assert status == 422 and "image 1" in answer["error"] and "base64" in answer["error"]
    status, answer = server.post("/predict", b"--x--", "multipart/form-data")
    assert status == 400 and "boundary" in answer["error"]
    assert server.call("GET", "/health")[0] == 200


def test_a_table_model_refuses_images_with_the_fix(tmp_path_factory):
    models = train_models(tmp_path_factory.mktemp("tables"))
    server = Server(models["heart"])
    try:
        status, answer = server.post("/predict", *multipart([("a.png", IMAGES[0].read_bytes())]))
        assert status == 422 and "not trained on image files" in answer["error"]
    finally:
        assert server.stop() == 0
