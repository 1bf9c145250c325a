"""One owner for every piece of state: state_dict / load_state_dict on the network (weights and
buffers), the optimizer (step, slots, scalars), early stopping (the best whole state) and the
trainer; checkpoints only serialize them, so new state needs no change to checkpoint.py."""

from __future__ import annotations

import io
import json
from typing import Literal

import numpy as np
import pytest

from magmadnn_cli.config.layers import LayerSpec
from magmadnn_cli.config.loading import load_config
from magmadnn_cli.commands.train import train
from magmadnn_cli.core.graph import Graph, Parameter, Variable, get_activation, nn, ops
from magmadnn_cli.core.graph.node import Op
from magmadnn_cli.data.prepare import Split
from magmadnn_cli.distributed import SingleProcess
from magmadnn_cli.distributed.data_parallel import DataParallel
from magmadnn_cli.nn.layers import Dense, Layer
from magmadnn_cli.nn.losses import CrossEntropy
from magmadnn_cli.nn.network import Network
from magmadnn_cli.nn.optimizers import SGD
from magmadnn_cli.training import checkpoint
from magmadnn_cli.training.run_folder import checkpoint_files
from magmadnn_cli.training.batches import BatchSchedule
from magmadnn_cli.training.trainer import Plan, Trainer

from conftest import blobs_csv, run_cli


# -- a toy layer with a buffer and a toy optimizer with a scalar, unknown to checkpoint.py ---------
class _CountBatches(Op):
    def __init__(self, x, count, mode) -> None:
        super().__init__(x)
        self.count, self.mode = count, mode

    def forward(self, x):
        if self.mode.training:
            self.count += 1
        return x

    def backward(self, g):
        return (g,)


class BatchCounterLayer(LayerSpec):
    """A test layer's declaration (no hyperparameters)."""
    type: Literal["batch_counter"]


class BatchCounter(Layer):
    """Passes its input through and counts training batches in a buffer."""
    declaration = BatchCounterLayer

    def compute_shape(self, input_shape):
        self.add_buffer("batches", (1,), 0.0)
        return input_shape

    def __call__(self, x, ctx):
        return _CountBatches(x, self.buffers["batches"], ctx.mode)


class DecayingSGD(SGD):
    """SGD whose step shrinks by 10% after every update: `scale` is state the optimizer owns."""
    name = "decaying_sgd"
    scalars = ("scale",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scale = 1.0

    def update(self, p, g, lr, state) -> None:
        p -= (lr * self.scale) * g
        self.scale *= 0.9


def _toy_trainer(seed: int) -> Trainer:
    layers = [Dense.of(units=8, activation="tanh", name="hidden"), BatchCounter.of(name="counter"),
              Dense.of(units=3, activation="softmax", name="out")]
    net = Network(layers, (4,), CrossEntropy(), seed=seed)
    return Trainer(DataParallel(net, DecayingSGD.of(learning_rate=0.2), SingleProcess()),
                   Plan("classification", BatchSchedule(16), seed=3))


def _data() -> Split:
    rng = np.random.default_rng(0)
    return Split(rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 3, 64))


def test_new_state_is_checkpointed_without_changing_checkpoint_py(tmp_path, blobs):
    config = load_config(blobs)
    trained = _toy_trainer(seed=1)
    trained.fit(_data(), None, 2)
    buffer = io.BytesIO()
    np.savez(buffer, **checkpoint.snapshot(trained, config, "data"))
    (tmp_path / "c.npz").write_bytes(buffer.getvalue())
    fresh = _toy_trainer(seed=2)  # other initial weights: everything must come from the checkpoint
    checkpoint.restore(checkpoint.read(tmp_path / "c.npz"), fresh)
    assert trained.net.state_dict()["counter/batches"][0] == 8  # 2 epochs of 4 batches
    for name, value in trained.net.state_dict().items():
        np.testing.assert_array_equal(fresh.net.state_dict()[name], value, err_msg=name)
    assert fresh.opt.scale == trained.opt.scale == pytest.approx(0.9 ** 8) and fresh.opt.t == 8
    trained.fit(_data(), None, 3)  # and both go on identically
    fresh.fit(_data(), None, 3)
    np.testing.assert_array_equal(fresh.net.flat_params, trained.net.flat_params)


def test_load_state_dict_refuses_a_missing_buffer():
    net = _toy_trainer(seed=1).net
    state = net.state_dict()
    del state["counter/batches"]
    with pytest.raises(Exception, match="no 'counter/batches'"):
        _toy_trainer(seed=2).net.load_state_dict(state)


# -- restore_best restores the whole state, batchnorm statistics included ------------------------
BN_CONFIG = """\
name: bn
seed: 4
device: cpu
data: {train: blobs.csv, target: label, validation_split: 0.3, normalize: standard}
model:
  layers:
    - {type: dense, units: 16, use_bias: false}
    - {type: batchnorm, momentum: 0.5}
    - {type: activation, activation: relu}
    - {type: dense, units: 3, activation: softmax}
loss: cross_entropy
optimizer: {type: adam, learning_rate: 0.05}
training:
  epochs: 60
  batch_size: 8
  early_stopping: {monitor: val_loss, patience: 3, restore_best: true}
"""


def test_restore_best_brings_back_the_batchnorm_statistics_of_the_best_epoch(tmp_path, capsys):
    blobs_csv(tmp_path / "blobs.csv", n=150)
    (tmp_path / "bn.yaml").write_text(BN_CONFIG)
    result = train(load_config(tmp_path / "bn.yaml"), tmp_path / "run")
    history = result.history
    assert history.stopped_early and history.best_epoch < len(history.epochs)
    best = history.epochs[history.best_epoch - 1]["val_loss"]
    # the reported validation loss is that of the saved model: the best epoch's, to rounding
    assert result.metrics["validation"]["loss"] == pytest.approx(best, rel=1e-5)
    assert history.epochs[-1]["val_loss"] != pytest.approx(best, rel=1e-3)
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["validation"]["loss"] == pytest.approx(best, rel=1e-5)


# -- graphs own their in-place gradient targets --------------------------------------------------
def test_a_second_graph_over_shared_ops_leaves_a_tied_weights_gradient_right():
    rng = np.random.default_rng(0)
    x1, x2 = (Variable(n, rng.normal(size=(5, 3))) for n in ("x1", "x2"))
    w = Parameter(rng.normal(size=(3, 2)), "w")
    w.grad_view = np.zeros((3, 2))
    linear = get_activation("linear")
    a, b = nn.Dense(x1, w, None, linear), nn.Dense(x2, w, None, linear)
    both = Graph(ops.Add(ops.Sum(a), ops.Sum(b)))  # w has two consumers here
    Graph(ops.Sum(a))  # ...and one here: this graph must not change how `both` writes gradients
    both.forward()
    both.backward()
    expected = x1.value.sum(axis=0)[:, None] + x2.value.sum(axis=0)[:, None]  # d/dw of sum(x1 w) + sum(x2 w)
    np.testing.assert_allclose(w.grad, np.broadcast_to(expected, (3, 2)), rtol=1e-12)


# -- a resumed run whose schedule horizon changes says so -----------------------------------------
def test_resuming_with_more_epochs_names_the_changed_learning_rate(capsys, blobs, tmp_path):
    run = tmp_path / "run"
    cosine = ("--set", "optimizer.schedule={type: cosine}")
    code, _, err = run_cli(capsys, "train", blobs, "--out", run, "-q", *cosine, "--set", "training.epochs=4")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", blobs, "--resume", run, "-q", *cosine, "--set", "training.epochs=8")
    assert code == 0, err
    text = " ".join(err.split())
    # the cosine over 4 epochs had reached min_lr 0; over 8 epochs, at epoch 4, it is half of 0.01
    assert "the learning-rate schedule changed at global step" in text
    assert "the next step's rate is 0.005 (it was 0 under the checkpoint's config)" in text
    assert "--set optimizer.schedule.epochs=4" in text
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "kept", "-q", *cosine,
                           "--set", "training.epochs=4")
    code, _, err = run_cli(capsys, "train", blobs, "--resume", tmp_path / "kept", "-q", "--set", "training.epochs=8",
                           "--set", "optimizer.schedule={type: cosine, epochs: 4}")
    assert code == 0 and "schedule changed" not in err


def test_blocks_inside_blocks_keep_every_weight_under_its_own_name():
    from magmadnn_cli.nn.layers import Residual
    dense = {"type": "dense", "units": 4, "activation": "tanh"}
    inner = Residual.of(layers=[dense], name="block")
    outer = Residual.of(layers=[{"type": "residual", "layers": [dense], "name": "block"}], name="outer")
    net = Network([Dense.of(units=4, activation="tanh", name="in"), inner, outer, Dense.of(units=3, activation="softmax", name="out")], (4,), CrossEntropy())
    names = [p.name for p in net.parameters]
    assert len(names) == len(set(names)) == len(net.state_dict()) == 8
    assert "outer.block.dense_0/kernel" in names and "block.dense_0/kernel" in names


def test_resuming_after_adding_a_schedule_reports_the_change(capsys, blobs, tmp_path):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", blobs, "--out", run, "-q", "--set", "training.epochs=2")[0] == 0
    code, _, err = run_cli(capsys, "train", blobs, "--resume", run, "-q", "--set", "training.epochs=4",
                           "--set", "optimizer.schedule={type: cosine}")
    assert code == 0 and "schedule changed" in err and "Traceback" not in err, err


def _history(run) -> list[list[str]]:
    """metrics.csv's rows without the time column."""
    rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()]
    keep = [i for i, name in enumerate(rows[0]) if name != "time"]
    return [[row[i] for i in keep] for row in rows]


def _as_format_2(path) -> None:
    """Rewrite a checkpoint as format 2 wrote it: the history's epochs inside the meta JSON."""
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    lines = arrays.pop("trainer/history_epochs").tobytes().split(b"\n")
    meta = json.loads(str(arrays["meta"]))
    meta["state"]["trainer"]["history"]["epochs"] = [json.loads(line) for line in lines]
    arrays.update(meta=np.array(json.dumps(meta)), format_version=np.array(2))
    np.savez(path, **arrays)


@pytest.mark.parametrize("written_by", ["this", "format 2"])
def test_a_resumed_run_continues_the_metrics_history_exactly(capsys, blobs, tmp_path, monkeypatch, written_by):
    """Each epoch is encoded once, whatever the checkpoints (their cost must not grow with the
    epochs run); a resumed run, also from a format-2 checkpoint, has the uninterrupted run's history."""
    from magmadnn_cli.training import trainer as trainer_module
    encoded = []
    real_dumps = trainer_module.json.dumps
    monkeypatch.setattr(trainer_module.json, "dumps", lambda v, *a, **k: encoded.append(v) or real_dumps(v, *a, **k))
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "whole", "-q", "--set", "training.epochs=6")
    assert code == 0, err
    assert [e["epoch"] for e in encoded if isinstance(e, dict) and "epoch" in e] == [1, 2, 3, 4, 5, 6]
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "cut", "-q", "--set", "training.epochs=3")
    assert code == 0, err
    if written_by == "format 2":
        _as_format_2(checkpoint_files(tmp_path / "cut" / "checkpoints")[-1])
    code, _, err = run_cli(capsys, "train", blobs, "--resume", tmp_path / "cut", "-q", "--set", "training.epochs=6")
    assert code == 0, err
    assert _history(tmp_path / "cut") == _history(tmp_path / "whole") and len(_history(tmp_path / "whole")) == 7
