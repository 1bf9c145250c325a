"""The next batch prepared while the step runs (issue 46 item 3): `training.batches.Prefetch` draws
an epoch's batches (gathered and augmented) one step ahead in a background thread, bounded, in order,
in the caller's backend; what drawing raises is raised at its step; leaving the loop (its end, an
error, a signal) stops and joins the thread. Training with it gives the same weights, bit for bit.
Every wait here is on an event or a thread's end, never a fixed sleep."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from conftest import ROOT, run_cli
from magmadnn_cli.core import backend as B
from magmadnn_cli.training import batches
from magmadnn_cli.training.batches import Prefetch, prefetched
from magmadnn_cli.training.trainer import Trainer


def alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "magmadnn-prefetch"]


def test_items_in_order_and_an_error_raised_where_its_item_is_taken():
    with Prefetch(iter(range(10))) as drawn:
        assert list(drawn) == list(range(10))

    def failing():
        yield from range(3)
        raise ValueError("batch 4 could not be gathered")
    taken = []
    with pytest.raises(ValueError, match="batch 4"), Prefetch(failing()) as drawn:
        for item in drawn:
            taken.append(item)
    assert taken == [0, 1, 2] and not alive()


@pytest.mark.parametrize("ahead", [1, 2])
def test_bounded_ahead_of_the_consumer(ahead):
    taken, lead = [0], []

    def items():
        for i in range(200):
            lead.append(i - taken[0])  # items drawn and not yet taken when item i is drawn
            yield i
    with Prefetch(items(), ahead) as drawn:
        for item in drawn:
            taken[0] = item + 1
    assert max(lead) <= ahead + 1 and len(lead) == 200


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_leaving_the_loop_early_stops_and_joins_the_thread(stop):
    gate, drawn_count = threading.Event(), []

    def items():
        for i in range(1000):
            if i == 1:
                gate.wait()  # the thread is busy drawing when the loop is left
            drawn_count.append(i)
            yield i
    with pytest.raises(stop), prefetched(items()) as drawn:
        for item in drawn:
            gate.set()
            raise stop()
    assert not alive() and len(drawn_count) <= 3


def test_drawn_in_the_callers_backend():
    def items():
        while True:
            yield B.current().floatx
    with B.using(B.cpu("float64")), prefetched(items()) as drawn:
        assert next(iter(drawn)) == np.float64


def test_ahead_zero_draws_in_the_caller():
    with prefetched(iter([threading.current_thread()]), 0) as drawn:
        assert list(drawn) == [threading.current_thread()]


# -- training ----------------------------------------------------------------------------------------
CONFIG = ROOT / "configs" / "digits_cnn.yaml"
SHORT = ["--set", "training.epochs=2", "--set", "training.early_stopping=null", "-q"]


@pytest.fixture
def counted(monkeypatch):
    """The Prefetch threads the trainer starts."""
    started = []
    real = batches.Prefetch.__init__

    def init(self, *args, **kw):
        started.append(self)
        real(self, *args, **kw)
    monkeypatch.setattr(batches.Prefetch, "__init__", init)
    return started


def weights(run):
    with np.load(run / "model.npz") as model:
        return {k: model[k] for k in model.files if k.startswith("weights/")}


def test_training_with_prefetch_gives_the_same_weights_bit_for_bit(tmp_path, capsys, monkeypatch, counted):
    augment = ["--set", "training.augment={crop_padding: 1, horizontal_flip: true}"]
    code, _, err = run_cli(capsys, "train", CONFIG, *SHORT, *augment, "--out", tmp_path / "ahead")
    assert code == 0, err
    assert len(counted) == 2 and not alive()  # one thread an epoch, each gone
    monkeypatch.setattr(batches, "PREFETCH", 0)
    code, _, err = run_cli(capsys, "train", CONFIG, *SHORT, *augment, "--out", tmp_path / "inline")
    assert code == 0, err
    assert len(counted) == 2
    ahead, inline = weights(tmp_path / "ahead"), weights(tmp_path / "inline")
    assert ahead.keys() == inline.keys()
    for k in ahead:
        np.testing.assert_array_equal(ahead[k], inline[k], err_msg=k)


def test_a_signal_while_the_next_batch_is_drawn_stops_cleanly(tmp_path, capsys, monkeypatch, counted):
    real = Trainer.micro_batches

    def signalling(self, batches_, step, x, y):
        if step == 3 and self.position.epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)  # from the prefetch thread: the main thread handles it
        return real(self, batches_, step, x, y)
    monkeypatch.setattr(Trainer, "micro_batches", signalling)
    code, _, err = run_cli(capsys, "train", CONFIG, *SHORT, "--out", tmp_path / "run")
    assert code == 130, err
    assert "interrupt" in err.lower() and counted and not alive()
    assert list((tmp_path / "run").glob("checkpoint*"))


def test_an_error_drawing_a_batch_is_reported_and_the_thread_gone(tmp_path, capsys, monkeypatch, counted):
    def failing(self, batches_, step, x, y):
        raise MemoryError("no room for the next batch")
    monkeypatch.setattr(Trainer, "micro_batches", failing)
    code, _, err = run_cli(capsys, "train", CONFIG, *SHORT, "--out", tmp_path / "run")
    assert code == 1 and "no room for the next batch" in err and "most recent call last" not in err
    assert counted and not alive()
