"""`training.cuda_graph: auto`, proven through the device stand-in: the training step is captured once
per batch shape after a warm-up step and replayed, and the replayed run ends with the eager run's
weights; a step that cannot be captured runs eagerly, said once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from conftest import ROOT, run_cli

CASES = {
    "sgd_momentum_dropout": ("digits_mlp", ["optimizer={type: sgd, learning_rate: 0.05, momentum: 0.9}"]),
    "adam_cosine": ("digits_mlp", ["optimizer.schedule={type: cosine}"]),
    "batchnorm_adam": ("resnet_small", []),
    "mixed_float16_loss_scale": ("digits_mlp", ["precision=mixed_float16"]),
    "mixed_bfloat16_conv": ("digits_cnn", ["precision=mixed_bfloat16"]),
    "clip_accumulation_augment": ("digits_cnn", ["optimizer.clip_norm=0.5", "training.gradient_accumulation_steps=2",
                                                 "training.augment={crop_padding: 1, horizontal_flip: true}"]),
}


def _train(capsys, out, config, settings, graph):
    sets = [a for s in [*settings, f"training.cuda_graph={graph}"] for a in ("--set", s)]
    code, stdout, err = run_cli(capsys, "train", ROOT / "configs" / f"{config}.yaml", "--set", "device=gpu",
                                "--set", "training.epochs=2", "--set", "training.early_stopping=null", *sets,
                                "--out", out)
    assert code == 0, err
    with np.load(out / "model.npz") as saved:
        return {k: saved[k] for k in saved.files if k.startswith("weights/")}, stdout + err


@pytest.mark.parametrize("case", sorted(CASES))
def test_captured_steps_replayed_give_the_eager_runs_weights(standin, monkeypatch, capsys, tmp_path, case):
    config, settings = CASES[case]
    launches, captures = Counter(), Counter()
    launch, end_capture = standin.cuda.Graph.launch, standin.cuda.Stream.end_capture

    def counted_launch(graph, stream=None):
        launches[id(graph)] += 1
        return launch(graph, stream)

    def counted_capture(stream):
        captures["n"] += 1
        return end_capture(stream)
    monkeypatch.setattr(standin.cuda.Graph, "launch", counted_launch)
    monkeypatch.setattr(standin.cuda.Stream, "end_capture", counted_capture)
    eager, _ = _train(capsys, tmp_path / "eager", config, settings, "false")
    assert not launches and not captures["n"]
    replayed, log = _train(capsys, tmp_path / "graph", config, settings, "auto")
    assert "runs eagerly" not in log
    assert 1 <= captures["n"] <= 2  # the full batches' shape, and the last short batch's
    assert len(launches) == captures["n"] and sum(launches.values()) >= 36  # 2 epochs of 20-40 steps, less 2 warm-ups
    for k in eager:
        np.testing.assert_array_equal(replayed[k], eager[k], err_msg=k)


def test_a_step_that_cannot_be_captured_runs_eagerly_said_once(standin, capsys, tmp_path):
    lars = ["optimizer={type: lars, learning_rate: 0.5, momentum: 0.9}"]
    eager, _ = _train(capsys, tmp_path / "eager", "digits_mlp", lars, "false")
    replayed, log = _train(capsys, tmp_path / "graph", "digits_mlp", lars, "auto")
    said = [line for line in log.splitlines() if "runs eagerly" in line]
    assert len(said) == 1 and "lars optimizer's update is not one kernel" in said[0], log
    for k in eager:
        np.testing.assert_array_equal(replayed[k], eager[k], err_msg=k)

