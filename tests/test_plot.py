"""`magmadnn plot`: a PNG a person can look at, for a run and for a search."""

from __future__ import annotations

import builtins
import re

import numpy as np
import pytest

from conftest import ctrl_c_in_epoch, run_cli

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


def test_a_cross_validations_metrics_per_fold_with_their_mean(capsys, blobs, tmp_path):
    """A `train --folds` folder has one metrics row per fold (no epochs): each metric is drawn per fold,
    one line per split, with the mean over the folds."""
    import json

    from magmadnn_cli.commands.plot import _cross_validation
    cv = tmp_path / "cv"
    assert run_cli(capsys, "train", blobs, "--folds", "3", "--out", cv, "-q", "--set", "training.epochs=3")[0] == 0
    code, _, err = run_cli(capsys, "plot", cv)
    assert code == 0 and f"wrote {cv / 'folds.png'}" in err, err
    pixels = _image(cv / "folds.png")
    assert pixels.shape[:2] == (800, 1000) and _not_blank(pixels)  # loss, accuracy, macro_f1, mcc: 2 x 2 panels
    metrics = json.loads((cv / "metrics.json").read_text())
    figure = _cross_validation(cv)
    axes = [ax for ax in figure.axes if ax.has_data()]
    assert [ax.get_title() for ax in axes] == ["loss", "accuracy", "macro_f1", "mcc"]
    for ax in axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        for split in ("train", "validation", "test"):
            folds = [f[split][ax.get_title()] for f in metrics["per_fold"]]
            assert list(lines[split].get_xdata()) == [1, 2, 3]
            np.testing.assert_allclose(lines[split].get_ydata(), folds)
            mean = metrics["mean"][split][ax.get_title()]
            label = f"{split} mean {mean:.4g}"
            np.testing.assert_allclose(lines[label].get_ydata(), mean)


def test_the_search_plots_legend_names_only_what_the_search_holds(capsys, blobs, tmp_path):
    from magmadnn_cli.commands.plot import _search_scatter
    blobs.write_text(blobs.read_text().replace("epochs: 15", "epochs: 2") + "search: {method: grid, space: "
                     "{optimizer.learning_rate: [0.01, 0.02, 0.05]}}\n")
    code, out, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t", "-q")
    assert code == 0, err
    best = re.search(r"best: trial (\d+)", out + err).group(1)

    def legend(folder):
        return [t.get_text() for t in _search_scatter(folder).axes[0].get_legend().get_texts()]
    assert legend(tmp_path / "t") == ["finished", f"best (trial {best})"]  # the trial tune chose
    assert _search_scatter(tmp_path / "t").axes[0].get_ylabel() == "val_accuracy (higher is better)"
    trials = tmp_path / "t" / "trials.csv"
    other = next(t for t in ("0", "1", "2") if t != best)
    trials.write_text(trials.read_text().replace(f"\n{other},ok,", f"\n{other},pruned,"))
    assert legend(tmp_path / "t") == ["finished", "pruned (stopped early)", f"best (trial {best})"]
    trials.write_text(trials.read_text().replace(",ok,", ",pruned,"))
    assert legend(tmp_path / "t") == ["pruned (stopped early)"]


def test_a_run_that_has_not_ended_is_drawn_from_its_newest_checkpoint(capsys, blobs, tmp_path, monkeypatch):
    """Stopped in epoch 4 (Ctrl-C with on_signal off): no metrics.json, and the checkpoint after epoch 3
    holds three epochs (as its metrics.csv, rewritten with each checkpoint), which are drawn, the lowest
    validation loss marked."""
    from magmadnn_cli.commands.plot import _figure
    ctrl_c_in_epoch(monkeypatch, 4)
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", blobs, "--out", run, "-q", "--set", "training.checkpoint.on_signal=false")
    assert code == 130 and not (run / "metrics.json").exists(), err
    monkeypatch.undo()
    figure, name = _figure(run)
    loss = figure.axes[0]
    assert name == "curves.png" and "not ended: the epochs of step" in figure._suptitle.get_text()
    train_line, validation_line, best_line = loss.lines
    assert list(train_line.get_xdata()) == [1, 2, 3]
    lowest = int(np.argmin(validation_line.get_ydata())) + 1
    assert list(best_line.get_xdata()) == [lowest, lowest] and f"lowest validation loss ({lowest})" in best_line.get_label()
    code, _, err = run_cli(capsys, "plot", run)
    assert code == 0 and _not_blank(_image(run / "curves.png"))


def test_files_a_person_put_in_a_run_folder_are_never_replaced_or_removed(capsys, blobs, tmp_path):
    """A person's own model.onnx and curves.png in a run folder: --overwrite and --resume removed them
    (saying 'exported from the model this run replaces'), plot replaced curves.png. Only the files
    magmadnn wrote there (recorded by content) are replaced or removed."""
    run = tmp_path / "run"
    assert run_cli(capsys, "train", blobs, "--out", run, "-q", "--set", "training.epochs=2")[0] == 0
    (run / "curves.png").write_text("MY PNG")
    code, _, err = run_cli(capsys, "plot", run)
    assert code == 2 and "curves.png (the default output): exists; it is not replaced without --overwrite" in err, err
    (run / "model.onnx").write_text("MY OWN")
    for again in (["--overwrite"], ["--resume", str(run), "--set", "training.epochs=3"]):
        code, out, err = run_cli(capsys, "train", blobs, "--out", run, *again)
        said = " ".join((out + err).split())
        assert code == 0 and (run / "model.onnx").read_text() == "MY OWN", said
        assert (run / "curves.png").read_text() == "MY PNG" and "removed " + str(run / "model.onnx") not in said, said
        assert said.count("model.onnx") == 1 and "kept" in said, said  # said once
    (run / "curves.png").unlink()
    assert run_cli(capsys, "plot", run)[0] == 0 and run_cli(capsys, "plot", run)[0] == 0  # its own: redrawn
    assert run_cli(capsys, "train", blobs, "--out", run, "-q", "--overwrite")[0] == 0
    assert not (run / "curves.png").exists()  # it drew the replaced run: removed with it


def test_plot_of_a_folder_that_is_not_there_says_so(capsys, tmp_path):
    for path, said in ((tmp_path / "nonexist", "no such folder"), (tmp_path / "f.txt", "is a file")):
        if said == "is a file":
            path.write_text("x")
        code, _, err = run_cli(capsys, "plot", path)
        assert code == 2 and f"{path}: {said}; plot takes a run or search folder" in err, err
