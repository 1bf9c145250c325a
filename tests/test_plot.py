"""`magmadnn plot`: a PNG a person can look at, for a run and for a search."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from conftest import run_cli

pytest.importorskip("matplotlib")


def _image(path):
    import matplotlib.image
    return matplotlib.image.imread(path)


def _not_blank(pixels) -> bool:
    """Lines and text: many pixels differ from the background, in several colours."""
    rgb = pixels[..., :3].reshape(-1, 3)
    background = np.median(rgb, axis=0)
    drawn = np.abs(rgb - background).sum(axis=1) > 0.1
    return drawn.mean() > 0.01 and len(np.unique(np.round(rgb[drawn], 1), axis=0)) >= 3


def test_a_runs_learning_curves(capsys, blobs, tmp_path):
    run = tmp_path / "run"
    blobs.write_text(blobs.read_text() + "  early_stopping: {monitor: val_loss, patience: 2}\n")
    assert run_cli(capsys, "train", blobs, "--out", run, "-q")[0] == 0
    code, _, err = run_cli(capsys, "plot", run)
    assert code == 0 and f"wrote {run / 'curves.png'}" in err
    pixels = _image(run / "curves.png")
    assert pixels.shape[:2] == (400, 1200)  # loss and accuracy side by side, 6 x 4 inches each at 100 dpi
    assert _not_blank(pixels)
    assert run_cli(capsys, "plot", run)[0] == 0  # its own curves.png, in its own run folder: redrawn


def test_plot_replaces_a_file_it_did_not_choose_only_with_overwrite(capsys, blobs, tmp_path):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", blobs, "--out", run, "-q", "--set", "training.epochs=2")[0] == 0
    (tmp_path / "notes.yaml").write_text("mine\n")
    (tmp_path / "link.png").symlink_to(tmp_path / "notes.yaml")
    for target, says in (("notes.yaml", "exists; it is not replaced without --overwrite"), ("link.png", "symbolic link")):
        code, _, err = run_cli(capsys, "plot", run, "-o", tmp_path / target)
        assert code == 2 and says in err, err
    assert (tmp_path / "notes.yaml").read_text() == "mine\n"
    assert run_cli(capsys, "plot", run, "-o", tmp_path / "notes.yaml", "--overwrite")[0] == 0
    assert _not_blank(_image(tmp_path / "notes.yaml"))


def test_a_searchs_objective_by_hyperparameter(capsys, blobs, tmp_path):
    blobs.write_text(blobs.read_text().replace("epochs: 15", "epochs: 3") + "search: {method: random, trials: 4, space: "
                     "{optimizer.learning_rate: {loguniform: [0.001, 0.1]}, model.layers.0.units: [4, 8]}}\n")
    assert run_cli(capsys, "tune", blobs, "--out", tmp_path / "t", "-q")[0] == 0
    code, _, err = run_cli(capsys, "plot", tmp_path / "t", "-o", tmp_path / "o.png")
    assert code == 0, err
    pixels = _image(tmp_path / "o.png")
    assert pixels.shape[:2] == (400, 1000) and _not_blank(pixels)


def test_without_matplotlib_the_message_says_how_to_get_it(capsys, blobs, tmp_path, monkeypatch):
    assert run_cli(capsys, "train", blobs, "--out", tmp_path / "run", "-q", "--set", "training.epochs=1")[0] == 0
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    code, _, err = run_cli(capsys, "plot", tmp_path / "run")
    assert code == 2 and "pip install 'magmadnn-cli[plot]'" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "curves.png").exists()


def test_plot_of_a_folder_that_is_neither(capsys, tmp_path):
    code, _, err = run_cli(capsys, "plot", tmp_path)
    assert code == 2 and "not a magmadnn run (metrics.csv) or search (trials.csv) folder" in err
