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
    (tmp_path / "mine.png").write_text("mine\n")
    (tmp_path / "link.png").symlink_to(tmp_path / "mine.png")
    for target, says in (("mine.png", "exists; it is not replaced without --overwrite"), ("link.png", "symbolic link")):
        code, _, err = run_cli(capsys, "plot", run, "-o", tmp_path / target)
        assert code == 2 and says in err, err
    assert (tmp_path / "mine.png").read_text() == "mine\n"
    assert run_cli(capsys, "plot", run, "-o", tmp_path / "mine.png", "--overwrite")[0] == 0
    assert _not_blank(_image(tmp_path / "mine.png"))


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


# -- issue 44, item 8: non-finite metrics, junk folders, -o and its format -------------------------
def _junk_run(tmp_path, text: str, name: str = "metrics.csv"):
    folder = tmp_path / "junk"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return folder


@pytest.mark.parametrize("values", ["nan,inf", "inf,-inf", "1e309,nan", "-inf,0.5"])
def test_non_finite_metrics_are_drawn_as_gaps(values, capsys, tmp_path):
    folder = _junk_run(tmp_path, "epoch,loss,val_loss,accuracy\n1,0.9,0.8,0.5\n"
                       f"2,{values},0.6\n3,0.5,0.4,0.7\n")
    code, _, err = run_cli(capsys, "plot", folder, "-o", tmp_path / "c.png")
    assert code == 0, err
    assert _not_blank(_image(tmp_path / "c.png"))


def test_non_finite_fold_and_trial_values_are_drawn_or_said(capsys, tmp_path):
    folds = _junk_run(tmp_path, "fold,train_loss,test_loss,test_accuracy\n1,0.5,inf,0.7\n2,nan,0.4,inf\n3,0.3,0.2,0.9\n")
    code, _, err = run_cli(capsys, "plot", folds, "-o", tmp_path / "f.png")
    assert code == 0, err
    search = _junk_run(tmp_path, "trial,status,objective,param:lr\n0,ok,inf,0.1\n1,ok,0.5,inf\n2,ok,nan,0.01\n"
                       "3,ok,0.3,0.001\n", "trials.csv")
    (search / "metrics.csv").unlink()
    code, _, err = run_cli(capsys, "plot", search, "-o", tmp_path / "s.png")
    assert code == 0 and "Traceback" not in err and "internal error" not in err, err


@pytest.mark.parametrize("junk, says", [
    (b"\x00\x01\x02garbage\xff\xfe", "metrics.csv"),
    ("just,some,words\n1,2,3\n", "no column 'epoch'"),
    ("epoch,loss\nabc,0.5\n", "line 2: epoch 'abc' is not a whole number"),
    ("epoch\n1\n2\n", "no loss or accuracy column"),
    ("", "no epochs to plot"),
    ("epoch,loss\n1,0.5,7,8\n2\n", None),
    ("fold,train_loss\nx,0.5\n", "line 2: fold 'x' is not a whole number"),
])
def test_a_folder_of_junk_gives_a_plot_or_one_message(junk, says, capsys, tmp_path):
    folder = _junk_run(tmp_path, junk)
    code, out, err = run_cli(capsys, "plot", folder, "-o", tmp_path / "j.png")
    assert "internal error" not in err and "Traceback" not in out + err, err
    if says is None:
        assert code == 0, err
    else:
        assert code == 2 and says in " ".join(err.split()) and str(folder / "metrics.csv") in " ".join(err.split()), err


@pytest.mark.parametrize("junk", ["trial,objective\n0,0.5\n", "status,param:lr\nok,0.1\n", "\xff"])
def test_a_junk_trials_csv_is_one_message(junk, capsys, tmp_path):
    folder = _junk_run(tmp_path, junk, "trials.csv")
    code, _, err = run_cli(capsys, "plot", folder, "-o", tmp_path / "t.png")
    assert code == 2 and str(folder / "trials.csv") in " ".join(err.split()) and "internal error" not in err, err


@pytest.mark.parametrize("name", ["metrics.csv", "model.npz", "metrics.json", "config.yaml", "checkpoints/x.npz"])
def test_plot_never_replaces_a_file_of_the_run(name, capsys, blobs, tmp_path):
    from conftest import snapshot
    run = tmp_path / "run"
    assert run_cli(capsys, "train", blobs, "--out", run, "-q", "--set", "training.epochs=2")[0] == 0
    if name.startswith("checkpoints/"):
        name = f"checkpoints/{sorted(p.name for p in (run / 'checkpoints').iterdir())[-1]}"
    before = snapshot(run)
    code, _, err = run_cli(capsys, "plot", run, "-o", run / name, "--overwrite")
    assert code == 2 and f"{run / name}: is a file of the run {run}" in " ".join(err.split()), err
    assert snapshot(run) == before


def test_plot_writes_the_format_its_suffix_names(capsys, blobs, tmp_path):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", blobs, "--out", run, "-q", "--set", "training.epochs=2")[0] == 0
    for name, head in (("c.pdf", b"%PDF"), ("c.PDF", b"%PDF"), ("c.svg", b"<?xml"), ("c.png", b"\x89PNG")):
        code, _, err = run_cli(capsys, "plot", run, "-o", tmp_path / name)
        assert code == 0 and (tmp_path / name).read_bytes().startswith(head), (name, err)
    assert b"<svg" in (tmp_path / "c.svg").read_bytes()
    for name in ("c.jpg", "c.txt", "curves"):
        code, _, err = run_cli(capsys, "plot", run, "-o", tmp_path / name)
        assert code == 2 and "--output" in err and ".png, .pdf or .svg" in err, err
        assert not (tmp_path / name).exists()
    code, out, _ = run_cli(capsys, "plot", "--help")  # the help promises what -o writes
    assert code == 0 and ".png, .pdf or .svg" in " ".join(out.replace("│", " ").split()), out


@pytest.mark.parametrize("rows", ["1,1e308,-1e308\n2,-1e308,1e308\n", "nan,0.5,0.5\n2,0.4,0.4\n", "inf,0.5,0.5\n"])
def test_values_too_large_to_draw_and_non_finite_epochs_give_a_plot_or_one_message(rows, capsys, tmp_path):
    folder = _junk_run(tmp_path, "epoch,loss,val_loss\n" + rows)
    code, out, err = run_cli(capsys, "plot", folder, "-o", tmp_path / "c.png")
    assert "internal error" not in err and (code == 0 or (code == 2 and str(folder / "metrics.csv") in err)), err
