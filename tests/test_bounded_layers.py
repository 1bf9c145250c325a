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


def test_a_process_count_from_the_config_is_named_as_the_config_key(capsys, tmp_path):
    from conftest import project
    config = project(tmp_path)
    for command in ("validate", "train"):
        code, _, err = run_cli(capsys, command, config, "--set", "distributed.processes=1000")
        assert code == 2 and "--set distributed.processes=1000: this machine has" in err, err  # what gave it
        assert "--processes 1000" not in err


def test_a_cnn_whose_convolution_sets_the_width_names_its_filters(capsys, tmp_path):
    from conftest import project
    config = project(tmp_path)
    text = (ROOT / "configs" / "digits_cnn.yaml").read_text().replace("../datasets/", str(ROOT / "datasets") + "/")
    config.write_text(text)
    layers = ("[{type: conv2d, filters: 5, kernel_size: 3, padding: same}, {type: activation, activation: relu}, "
              "{type: global_avg_pool}, {type: activation, activation: softmax}]")
    code, _, err = run_cli(capsys, "validate", config, "--set", f"model.layers={layers}")
    assert code == 2 and "model.layers.0.filters: the output layer has 5 units; expected 10" in err, err
