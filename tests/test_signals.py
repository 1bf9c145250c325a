"""Ctrl-C and SIGTERM outside the training loop stop the command: exit 128 + the signal, the word
"interrupted", no partial output (a file the signal caught already renamed into place is whole).
numpy and pyarrow can turn the KeyboardInterrupt into another exception (a string ufunc's TypeError)
or a reader can take it for bad input and fall back, so a newcomer saw a stopped `predict` report an
internal error or run on to "wrote 400000 predictions"."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import BLOBS_CONFIG, run_cli, write_csv

CONFIG = BLOBS_CONFIG.replace("blobs.csv", "train.csv").replace("units: 3", "units: 2")


def _rows(n: int, seed: int) -> list[list]:
    r = np.random.default_rng(seed)
    colours = r.choice(["red", "green", "blue", "n/a"], size=n)
    x = np.round(r.normal(size=(n, 2)), 3)
    return [[a, b, c, "yes" if a > 0 else "no"] for (a, b), c in zip(x, colours)]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A model with a text feature, and a 250k-row file that `predict` reads for about a second or more."""
    folder = tmp_path_factory.mktemp("signals")
    write_csv(folder / "train.csv", ["f1", "f2", "colour", "label"], _rows(200, 0))
    (folder / "colours.yaml").write_text(CONFIG)
    write_csv(folder / "big.csv", ["f1", "f2", "colour", "label"], _rows(250_000, 1))
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", "colours.yaml", "--out", "run", "-q",
                           "--set", "training.epochs=1"],
                          cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return folder


def _wait_until_writing(folder, p: subprocess.Popen, limit: float = 120.0) -> None:
    """Until `predict` has opened its temporary output (or ended)."""
    deadline = time.monotonic() + limit
    while p.poll() is None and not list(folder.glob(".p.csv*")) and time.monotonic() < deadline:
        time.sleep(0.01)


def _stopped(folder, delay: float, sig: int) -> tuple[int, str, bool]:
    """Run `predict` on the big file, send `sig` after `delay` s: (exit code, stderr, whether the
    signal went out before the command had ended)."""
    p = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", "predict", "run/model.npz", "big.csv", "-o", "p.csv"],
                         cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_writing(folder, p)  # the event: past start-up (a signal before the handlers would test Python)
    time.sleep(delay)
    sent = p.poll() is None
    if sent:
        p.send_signal(sig)
    _, stderr = p.communicate(timeout=120)
    return p.returncode, stderr, sent


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_at_any_moment_of_predict_stops_it(project, sig):
    outcomes = []
    for delay in (0.0, 0.2, 0.4, 0.6, 0.9, 1.2):
        code, stderr, sent = _stopped(project, delay, sig)
        if not sent or "wrote 250000 predictions" in stderr:  # it had finished: nothing was left to stop
            # 0, -sig (the signal came as the interpreter was exiting) or 128 + sig (it came after the
            # output was complete, before the process ended): the written file is whole either way
            assert code in (0, -sig, 128 + sig), stderr
            with open(project / "p.csv") as f:
                assert sum(1 for _ in f) == 250001, "a finished run's output is not whole"
            (project / "p.csv").unlink()
            continue
        outcomes.append(delay)
        assert code == 128 + sig, f"after {delay} s: exit {code}\n{stderr}"
        assert "interrupted" in stderr and "internal error" not in stderr and "Traceback" not in stderr, stderr
        if (project / "p.csv").exists():  # the signal came after the output was renamed into place
            with open(project / "p.csv") as f:
                assert sum(1 for _ in f) == 250001, f"after {delay} s a partial output was left"
            (project / "p.csv").unlink()
        assert not list(project.glob("*.tmp*")) and not list(project.glob(".p.csv*")), "a temporary file was left"
    assert outcomes, "every run ended before its signal: the file is too small to test this"


def test_an_interrupt_that_numpy_turned_into_another_error_is_reported_as_the_interruption(capsys, monkeypatch,
                                                                                            tmp_path):
    """numpy 2's string ufuncs re-raise an exception from a signal handler as TypeError ('result
    array type does not match underlying function'): that is the user's Ctrl-C, not a bug."""
    from magmadnn_cli import signals
    from magmadnn_cli.commands import summary

    def converted(*args, **kwargs):
        signals.record(signal.SIGINT)
        raise TypeError("result array type does not match underlying function")
    monkeypatch.setattr(summary, "summarize", converted)
    (tmp_path / "c.yaml").write_text(CONFIG)
    (tmp_path / "train.csv").write_text("a,label\n1,x\n")
    code, _, err = run_cli(capsys, "summary", str(tmp_path / "c.yaml"))
    assert code == 130, err
    assert "interrupted" in err and "internal error" not in err
    assert signals.received() == 0, "the record outlived the command"


def test_a_reader_does_not_fall_back_past_a_signal(tmp_path):
    """A chunk whose parse failed after a signal came is not re-read as text: the read stops."""
    from magmadnn_cli import signals
    from magmadnn_cli.data.csv_reader import CsvFormat, parse_cells
    lines = ["1,red", "2,n/a"]
    with signals.watching():
        signals.record(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            parse_cells(lines, tmp_path / "d.csv", ["a", "b"], [0, 1], 2, CsvFormat(), np.float32, set())
    assert signals.received() == 0


@pytest.mark.parametrize("when", ["creating", "writing"])
def test_a_stop_signal_as_an_output_file_is_made_leaves_nothing(tmp_path, monkeypatch, when):
    """A signal right after the temporary file exists, before its name is known to the writer (the
    moment the predict test above sends one at 0 s), or while it is written: the command stops and
    no file is left in the folder."""
    import tempfile

    from magmadnn_cli import files, signals
    real = tempfile.mkstemp

    def made_then_signalled(*args, **kwargs):
        made = real(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # its handler runs before this call returns the name
        return made
    if when == "creating":
        monkeypatch.setattr(files.tempfile, "mkstemp", made_then_signalled)
    with signals.watching(), pytest.raises(KeyboardInterrupt):
        files.atomic_write(tmp_path / "out.csv", lambda f: (f.write(b"x"), signal.raise_signal(signal.SIGINT)))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    files.write_text(tmp_path / "after.txt", "the hold ended with the signal")  # no signal is left pending
    assert [p.name for p in tmp_path.iterdir()] == ["after.txt"]
