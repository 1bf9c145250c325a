"""Pixels right by default: 8-bit images scaled to [0, 1] unless data.scale says otherwise (said once),
float images of 0-255 values warned about, channels-last NPZ arrays transposed (never reshaped), and a
data.shape that would reorder pixels refused with the transpose named."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data.prepare import prepare
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError

rng = np.random.default_rng(11)


def npz(path, x, y=None):
    np.savez(path, x=x, y=np.arange(len(x)) % 2 if y is None else y)
    return path


def notes_with(notes, text):
    return [n for n in notes if text in n]


def images8(n=20, shape=(1, 6, 6)):
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def test_uint8_images_scaled_by_default_and_said_once(tmp_path):
    x = images8()
    p = prepare(DataConfig(train=npz(tmp_path / "a.npz", x), validation_split=0.25), "classification", 0)
    got = np.concatenate([p.train.x, p.validation.x]).reshape(-1)
    assert got.min() >= 0.0 and got.max() <= 1.0 and got.max() > 0.9
    assert p.settled["scale"] == pytest.approx(1 / 255)
    said = notes_with(p.notes, "8-bit")
    assert len(said) == 1 and "data.scale" in said[0] and "[0, 1]" in said[0]


def test_uint8_data_scale_wins(tmp_path):
    x = images8()
    p = prepare(DataConfig(train=npz(tmp_path / "a.npz", x), validation_split=0.0, scale=0.5), "classification", 0)
    assert p.train.x.max() == pytest.approx(0.5 * x.max())
    assert not notes_with(p.notes, "8-bit") and "scale" not in p.settled


def test_uint8_flat_rows_with_shape_are_images(tmp_path):
    x = images8().reshape(20, 36)
    p = prepare(DataConfig(train=npz(tmp_path / "a.npz", x), validation_split=0.0, shape=[1, 6, 6]),
                "classification", 0)
    assert p.train.x.shape[1:] == (1, 6, 6) and p.train.x.max() <= 1.0
    # flat 8-bit rows without a shape are a table: standardized as before, no scale settled
    q = prepare(DataConfig(train=npz(tmp_path / "a.npz", x), validation_split=0.0), "classification", 0)
    assert "scale" not in q.settled and not notes_with(q.notes, "8-bit")
    assert abs(float(q.train.x.mean())) < 1e-3


def test_uint8_idx_scaled_by_default(tmp_path):
    def write_idx(path, array):
        path.write_bytes(gzip.compress(bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
                                       + array.astype(np.uint8).tobytes()))
    write_idx(tmp_path / "t-images-idx3-ubyte.gz", images8(shape=(6, 6)))
    write_idx(tmp_path / "t-labels-idx1-ubyte.gz", np.arange(20) % 2)
    p = prepare(DataConfig(train=tmp_path / "t-images-idx3-ubyte.gz", validation_split=0.0), "classification", 0)
    assert p.train.x.max() <= 1.0 and len(notes_with(p.notes, "8-bit")) == 1


def test_float_pixels_of_0_255_warned(tmp_path):
    x = images8().astype(np.float32)
    p = prepare(DataConfig(train=npz(tmp_path / "f.npz", x), validation_split=0.0), "classification", 0)
    said = notes_with(p.notes, "0-255")
    assert len(said) == 1 and "data.scale" in said[0] and "f.npz" in said[0]
    assert p.train.x.max() > 200  # warned, not changed
    for quiet in (DataConfig(train=tmp_path / "f.npz", validation_split=0.0, scale=1 / 255),
                  DataConfig(train=tmp_path / "f.npz", validation_split=0.0, normalize="standard"),
                  DataConfig(train=npz(tmp_path / "g.npz", x / 255), validation_split=0.0)):
        assert not notes_with(prepare(quiet, "classification", 0).notes, "0-255")


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_channels_last_npz_transposed_never_reshaped(tmp_path, channels):
    x = rng.normal(size=(5, 7, 6, channels)).astype(np.float32)
    t = read_table(npz(tmp_path / "c.npz", x), ReadSpec(None, None))
    assert t.x.shape == (5, channels, 7, 6)
    np.testing.assert_array_equal(t.x, x.transpose(0, 3, 1, 2))
    said = notes_with(t.notes, "channels-last")
    assert len(said) == 1 and "(5, 7, 6, " in said[0] and f"({channels}, 7, 6)" in said[0]


def test_channels_first_npz_left_alone(tmp_path):
    for shape in [(5, 3, 7, 6), (5, 3, 4, 4), (5, 1, 1, 3)]:  # channels first, or ambiguous: left as written
        x = rng.normal(size=shape).astype(np.float32)
        t = read_table(npz(tmp_path / "c.npz", x), ReadSpec(None, None))
        np.testing.assert_array_equal(t.x, x)
        assert not notes_with(t.notes, "channels-last")


def test_channels_last_with_the_channels_first_shape_reads_right(tmp_path):
    x = images8(shape=(6, 5, 3))
    p = prepare(DataConfig(train=npz(tmp_path / "c.npz", x), validation_split=0.0, shape=[3, 6, 5], stratify=False,
                           scale=1.0), "classification", 0)
    want = x.transpose(0, 3, 1, 2).astype(np.float32)
    gaps = np.abs(p.train.x[:, None] - want[None]).sum(axis=(2, 3, 4))  # (trained, stored)
    assert (gaps.min(axis=1) == 0).all()  # every trained image is a stored one, pixels in place


@pytest.mark.parametrize("stored, shape, axes", [((3, 6, 5), [6, 5, 3], "(1, 2, 0)"),
                                                 ((6, 5, 3), [6, 5, 3], "(1, 2, 0)"),
                                                 ((1, 6, 5), [1, 5, 6], "(0, 2, 1)")])
def test_shape_that_reorders_pixels_refused(tmp_path, stored, shape, axes):
    x = rng.normal(size=(4, *stored)).astype(np.float32)
    with pytest.raises(DataError, match=r"data\.shape.*reorder.*transpose") as info:
        prepare(DataConfig(train=npz(tmp_path / "s.npz", x), validation_split=0.0, shape=shape), "classification", 0)
    assert axes in str(info.value) and "s.npz" in str(info.value)


def test_shape_that_only_adds_or_drops_axes_allowed(tmp_path):
    x = rng.normal(size=(4, 6, 5)).astype(np.float32)
    for shape, want in (([1, 6, 5], (1, 6, 5)), ([30], (30,))):
        p = prepare(DataConfig(train=npz(tmp_path / "s.npz", x), validation_split=0.0, shape=shape),
                    "classification", 0)
        assert p.train.x.shape[1:] == want


def test_train_from_8bit_npz_says_the_scale_once(tmp_path, capsys):
    x = images8(n=40)
    npz(tmp_path / "d.npz", x, np.arange(40) % 2)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: px\nseed: 0\ndata: {train: d.npz, validation_split: 0.25}\nmodel:\n  layers:\n"
                   "    - {type: flatten}\n    - {type: dense, units: 2, activation: softmax}\n"
                   "loss: cross_entropy\noptimizer: {type: sgd, learning_rate: 0.01}\ntraining: {epochs: 1}\n")
    code, out, err = run_cli(capsys, "train", cfg, "--out", tmp_path / "run")
    assert code == 0, out + err
    assert (out + err).count("8-bit") == 1
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "scale: 0.00392156862745098" in saved
