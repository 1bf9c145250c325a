"""`training.batch_schedule`: growing global batches (Smith et al. 2018). Epoch sizes and the epoch
position of every global step against hand counts; the learning-rate schedule follows epochs, not
steps; a schedule that starts at B is batch_size B; resume mid-schedule is the uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.config.schema import Config
from magmadnn_cli.training.batches import BatchSchedule
from magmadnn_cli.training.builder import build_optimizer

from conftest import run_cli, saved_weights


def test_sizes_and_epoch_positions_by_hand():
    s = BatchSchedule(32, {3: 50, 5: 100})
    assert [s.size(e) for e in range(1, 7)] == [32, 32, 50, 50, 100, 100]
    # 100 rows: epochs 1-2 take 4 steps each, 3-4 two each, then one each
    assert [s.epochs_done(100, t) for t in (0, 2, 4, 8, 9, 10, 11, 12, 13)] == \
        [0, 0.5, 1, 2, 2.5, 3, 3.5, 4, 5]


def test_the_learning_rate_schedule_follows_epochs():
    """Step decay x0.1 every 2 epochs; 100 rows: epochs 1-2 take 4 steps each, then 2 each."""
    config = Config.model_validate({"name": "lr",
        "data": {"synthetic": {"samples": 100, "features": 3, "classes": 2}},
        "model": {"layers": [{"type": "dense", "units": 2, "activation": "softmax"}]}, "loss": "cross_entropy",
        "optimizer": {"type": "sgd", "learning_rate": 1.0, "schedule": {"type": "step", "step_size": 2}},
        "training": {"batch_size": 32, "batch_schedule": {3: 50}}})
    opt = build_optimizer(config, 4, rows=100)
    for step, lr in [(3, 1.0), (7, 1.0), (8, 0.1), (11, 0.1), (12, 0.01)]:  # 12 steps = 4 epochs (not 3)
        opt.t = step
        assert opt.lr() == pytest.approx(lr), step


def _train(capsys, config, out, *sets):
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q", *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
    return out


def test_a_schedule_from_epoch_one_is_that_batch_size(capsys, tmp_path, blobs):
    config = blobs
    plain = _train(capsys, config, tmp_path / "plain", "training.batch_size=64", "training.epochs=3")
    scheduled = _train(capsys, config, tmp_path / "sched", "training.batch_size=8", "training.batch_schedule={1: 64}",
                       "training.epochs=3")
    for key, value in saved_weights(plain).items():
        np.testing.assert_array_equal(saved_weights(scheduled)[key], value)


def test_global_steps_and_resume_mid_schedule(capsys, tmp_path, blobs):
    config = blobs
    sets = ("training.batch_size=16", "training.batch_schedule={2: 32, 3: 64}", "training.epochs=3",
            "training.checkpoint.keep=5", "data.validation_split=0", "optimizer.schedule={type: cosine}")
    full = _train(capsys, config, tmp_path / "full", *sets)
    steps = [-(-120 // b) for b in (16, 32, 64)]  # the 120 blobs rows: 8, 4 and 2 steps
    names = sorted(p.name for p in (full / "checkpoints").glob("step*.npz"))
    assert names == [f"step{sum(steps[:e]):08d}.npz" for e in (1, 2, 3)]
    history = [dict(zip(lines[0].split(","), line.split(","))) for lines in [(full / "metrics.csv").read_text().splitlines()]
               for line in lines[1:]]
    assert [row["batch_size"] for row in history] == ["16", "32", "64"]
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "resumed", "-q", "--resume",
                           full / "checkpoints" / names[1], *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
    for key, value in saved_weights(full).items():
        np.testing.assert_allclose(saved_weights(tmp_path / "resumed")[key], value, rtol=0, atol=1e-6)


def test_schedule_epochs_start_at_one(capsys, tmp_path, blobs):
    config = blobs
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "o", "--set", "training.batch_schedule={0: 64}")
    assert code == 2
    assert "batch_schedule" in err and "Traceback" not in err


def test_split_bounds_cut_a_range_as_numpy_array_split_does():
    import numpy as np
    from magmadnn_cli.training.batches import split_bounds
    for lo, hi in ((0, 0), (3, 4), (10, 37), (100, 164)):
        for shares in (1, 2, 3, 5, 8):
            parts = np.array_split(np.arange(lo, hi), shares)
            for share, part in enumerate(parts):
                a, b = split_bounds(lo, hi, shares, share)
                assert list(range(a, b)) == part.tolist(), (lo, hi, shares, share)
