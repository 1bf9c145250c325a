"""Layer geometry that no machine can hold is refused by `validate` as by `train`, before anything is
allocated, with the layer named (was: valid, then ZeroDivisionError / 'negative dimensions' /
'Maximum allowed dimension exceeded' as internal errors)."""

from __future__ import annotations

import pytest

from conftest import ROOT, run_cli


@pytest.mark.parametrize("setting", ["padding=2147483646", "padding=4294967294", "padding=1000000000",
                                     "dilation=4611686018427387904", "dilation=1000000000"])
def test_huge_padding_or_dilation_is_refused_by_validate_and_train(capsys, tmp_path, setting):
    override = ("--set", f"model.layers.0.{setting}")
    code, _, err = run_cli(capsys, "validate", ROOT / "configs" / "digits_cnn.yaml", *override)
    assert code == 2 and "layer 'conv2d_0' (conv2d" in err and "one sample's padded input" in err, err
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", *override, "--out", tmp_path / "r")
    assert code == 2 and "one sample's padded input" in err and "internal error" not in err, err
    assert not (tmp_path / "r" / "model.npz").exists()


def test_ordinary_padding_is_still_valid(capsys):
    code, out, err = run_cli(capsys, "validate", ROOT / "configs" / "digits_cnn.yaml", "--set",
                             "model.layers.0.padding=3")
    assert code == 0 and "valid" in out, err
