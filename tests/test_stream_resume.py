"""Streamed runs checkpoint and resume mid-epoch (issue 48, item 3): a run stopped by a signal in the
middle of an epoch and resumed ends with the uninterrupted run's weights, bit for bit; the
position in the epoch is recomputed from the seed, the epoch and the step (the epoch's plan replayed,
the steps done skipped); a checkpoint of other data is refused."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import yaml

from conftest import run_cli
from magmadnn_cli.training.run_folder import checkpoint_files
from magmadnn_cli.training.trainer import Trainer
from test_stream_train import _write, small_blocks  # noqa: F401  (a fixture)


def _config(tmp_path, data, **training) -> str:
    cfg = {"name": "resumed", "seed": 3,
           "data": {"train": str(data), "target": "label", "stream": True, "validation_split": 0.15},
           "model": {"layers": [{"type": "dense", "units": 12, "activation": "relu"}, {"type": "dropout", "rate": 0.2},
                                {"type": "dense", "units": 2, "activation": "softmax"}]},
           "loss": "cross_entropy", "optimizer": {"type": "adam", "learning_rate": 0.01},
           "training": {"epochs": 3, "batch_size": 25, **training}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _weights(run) -> dict[str, np.ndarray]:
    with np.load(run / "model.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files if k.startswith("weights/")}


def _sigterm_at(monkeypatch, epoch: int, step: int) -> None:
    """A real SIGTERM to this process once `step` of `epoch` is counted."""
    real = Trainer.record_step

    def counted(self, done, *args):
        real(self, done, *args)
        if (self.position.epoch, done) == (epoch, step):
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(Trainer, "record_step", counted)


@pytest.mark.usefixtures("small_blocks")
def test_a_streamed_run_stopped_mid_epoch_resumes_bitwise(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path, _write(tmp_path, "csv"))
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "whole", "--set", "training.checkpoint=null")
    assert code == 0, out + err
    with monkeypatch.context() as patched:
        _sigterm_at(patched, 2, 7)
        code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "stopped")
    assert code == 128 + signal.SIGTERM, out + err
    meta = json.loads(str(np.load(checkpoint_files(tmp_path / "stopped" / "checkpoints")[-1])["meta"]))
    position = meta["state"]["trainer"]["position"]
    assert position["epoch"] == 2 and 7 <= position["step"] < 30  # in the middle of epoch 2
    code, out, err = run_cli(capsys, "train", config, "--resume", tmp_path / "stopped")
    assert code == 0, out + err
    assert f"epoch 2, step {position['step']}" in out + err
    whole, resumed = _weights(tmp_path / "whole"), _weights(tmp_path / "stopped")
    assert whole and whole.keys() == resumed.keys()
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)
    assert "no checkpoints" not in out + err


@pytest.mark.usefixtures("small_blocks")
def test_every_step_checkpoint_resumes_to_the_same_weights(tmp_path, capsys):
    """Resumed from each of several step checkpoints (an accumulating run with a short last update),
    the run ends where the uninterrupted one did."""
    config = _config(tmp_path, _write(tmp_path, "parquet"), gradient_accumulation_steps=2,
                     checkpoint={"every_steps": 9, "keep": 100})
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "whole")
    assert code == 0, out + err
    whole = _weights(tmp_path / "whole")
    for ckpt in checkpoint_files(tmp_path / "whole" / "checkpoints")[1:5]:
        code, out, err = run_cli(capsys, "train", config, "--resume", ckpt, "--out", tmp_path / ckpt.stem)
        assert code == 0, out + err
        for name, value in _weights(tmp_path / ckpt.stem).items():
            np.testing.assert_array_equal(value, whole[name], err_msg=f"{ckpt.name}: {name}")


@pytest.mark.usefixtures("small_blocks")
def test_a_checkpoint_of_other_data_is_refused(tmp_path, capsys):
    config = _config(tmp_path, _write(tmp_path, "csv"), checkpoint={"every_steps": 5})
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run")
    assert code == 0, out + err
    data = tmp_path / "t.csv"
    data.write_text(data.read_text().replace(",red,", ",blue,", 40))
    code, out, err = run_cli(capsys, "train", config, "--resume", tmp_path / "run", "--set", "training.epochs=4")
    assert code == 2, out + err
    assert "training data" in err and "differs from the checkpoint" in err and "Traceback" not in err
