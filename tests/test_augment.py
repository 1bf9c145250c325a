"""Augmentation: crops are shifted windows of the zero-padded image, flips mirror, both seeded."""

from __future__ import annotations

import numpy as np

from magmadnn_cli.data.augment import augment

from conftest import ROOT, run_cli


def test_random_crop_is_a_shifted_window_of_the_padded_image():
    x = np.arange(2 * 3 * 5 * 5, dtype=np.float32).reshape(2, 3, 5, 5)
    out = augment(x, np.arange(2), 7, crop_padding=2)
    assert out.shape == x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    for n in range(2):  # each sample equals exactly one of the 25 possible windows
        hits = [(dy, dx) for dy in range(5) for dx in range(5) if np.array_equal(out[n], padded[n, :, dy:dy + 5, dx:dx + 5])]
        assert len(hits) >= 1
    again = augment(x, np.arange(2), 7, crop_padding=2)
    np.testing.assert_array_equal(out, again)
    # a row's crop depends only on its position: row 1 alone, at position 1, is cropped the same way
    np.testing.assert_array_equal(augment(x[1:], np.array([1]), 7, crop_padding=2), out[1:])


def test_crop_offsets_cover_every_window_evenly():
    from magmadnn_cli.data.augment import draws
    dy, dx, flip = draws(np.arange(25_000), 3, crop_padding=2)
    counts = np.bincount(dy * 5 + dx, minlength=25)
    assert counts.min() > 850 and counts.max() < 1150  # 1000 expected per window
    assert 0.48 < flip.mean() < 0.52


def test_horizontal_flip_mirrors_about_half_the_batch():
    x = np.random.default_rng(1).random((400, 1, 2, 3)).astype(np.float32)
    out = augment(x, np.arange(400), 2, horizontal_flip=True)
    flipped = np.array([np.array_equal(o, s[..., ::-1]) for o, s in zip(out, x)])
    same = np.array([np.array_equal(o, s) for o, s in zip(out, x)])
    assert np.all(flipped | same) and 150 < flipped.sum() < 250


def test_augmented_training_from_the_cli(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", "--out", tmp_path / "r", "-q",
                           "--set", "training.epochs=2", "--set", "training.augment={crop_padding: 1}")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_mlp.yaml", "--out", tmp_path / "s", "-q",
                           "--set", "training.augment={horizontal_flip: true}")
    assert code == 2 and "training.augment is for (channels, height, width) images" in err
