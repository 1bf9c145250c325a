"""--overwrite keeps what it replaces until it is replaced (issue 44, item 1): a run, cross-validation
or search started with --overwrite that fails, is stopped or finds the disk full leaves the earlier
run as it was, and says so; a full disk anywhere (the lock, a checkpoint, the final files) is one
message naming the path, exit 2, with no temp file left behind."""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from conftest import BLOBS_CONFIG, ctrl_c_in_epoch, project, run_cli, snapshot

SHORT = BLOBS_CONFIG.replace("epochs: 15", "epochs: 3")
SEARCH = "search: {space: {optimizer.learning_rate: [0.01, 0.02]}}\n"
STASH = ".magmadnn-replaced"


def _flat(text: str) -> str:
    return " ".join(text.split())


class _FullFile:
    """A file on a full disk: the first write lands half, then ENOSPC (as a real disk fills)."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def write(self, data: Any) -> int:
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> "_FullFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def disk_full(monkeypatch, pattern: str) -> None:
    """Writes to files whose path matches `pattern` (fnmatch, on the absolute path) fail with ENOSPC
    after half their bytes, whether written with os.write or through os.fdopen."""
    real_fdopen, real_write = os.fdopen, os.write

    def full(fd: int) -> bool:
        try:
            return fnmatch.fnmatch(os.readlink(f"/proc/self/fd/{fd}"), pattern)
        except OSError:
            return False

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        f = real_fdopen(fd, *args, **kwargs)
        return _FullFile(f) if full(fd) else f

    def write(fd: int, data: Any) -> int:
        if full(fd):
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)
    monkeypatch.setattr(os, "fdopen", fdopen)
    monkeypatch.setattr(os, "write", write)


def _temps(folder: Path) -> list[str]:
    return [str(p) for p in folder.parent.rglob("*") if p.name.endswith(".tmp") or p.name == STASH]


@pytest.fixture
def earlier(capsys, tmp_path):
    """A finished run in tmp_path/r, its config, and every file of it with its bytes."""
    config = project(tmp_path, SHORT)
    out = tmp_path / "r"
    assert run_cli(capsys, "train", config, "--out", out, "-q")[0] == 0
    assert list(out.glob("checkpoints/*.npz"))
    return config, out, snapshot(out)


def test_a_replacing_run_that_diverges_puts_the_earlier_run_back(capsys, earlier):
    config, out, before = earlier
    code, _, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q",
                           "--set", "optimizer.learning_rate=1e30", "--set", "optimizer.type=sgd")
    assert code == 2 and "Traceback" not in err, err
    assert f"the earlier run in {out} is put back as it was" in _flat(err), err
    assert snapshot(out) == before and not _temps(out)
    assert run_cli(capsys, "evaluate", out, out.parent / "blobs.csv")[0] == 0


def test_a_replacing_run_stopped_by_ctrl_c_puts_the_earlier_run_back(capsys, earlier, monkeypatch):
    config, out, before = earlier
    ctrl_c_in_epoch(monkeypatch, 2)
    code, _, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q")
    assert code == 130, err
    said = _flat(err)
    assert f"the earlier run in {out} is put back as it was" in said and "Continue with" not in said, err
    assert snapshot(out) == before and not _temps(out)


def test_a_replacing_run_stopped_by_sigterm_at_a_checkpoint_puts_the_earlier_run_back(capsys, earlier, monkeypatch):
    """SIGTERM lands during epoch 2: the run writes a checkpoint and stops (exit 143)."""
    from magmadnn_cli.training.trainer import Trainer
    config, out, before = earlier
    real = Trainer._epoch

    def terminated(self, *args):
        if self.position.epoch == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler notes it, as from `kill`
        return real(self, *args)
    monkeypatch.setattr(Trainer, "_epoch", terminated)
    code, _, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q")
    assert code == 143, err
    said = _flat(err)
    assert f"the earlier run in {out} is put back as it was" in said and "Continue with" not in said, err
    assert snapshot(out) == before and not _temps(out)


@pytest.mark.parametrize("pattern, named", [("checkpoints/.step*.npz.*.tmp", "checkpoints/step"),
                                            (".model.npz.*.tmp", "model.npz"), (".metrics.json.*.tmp", "metrics.json"),
                                            (".config.yaml.*.tmp", "config.yaml"), (".magmadnn.lock", ".magmadnn.lock")])
def test_a_full_disk_while_replacing_is_one_message_and_keeps_the_earlier_run(pattern, named, capsys, earlier,
                                                                              monkeypatch):
    config, out, before = earlier
    disk_full(monkeypatch, str(out / pattern))
    code, _, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q")
    monkeypatch.undo()
    said = _flat(err)
    assert code == 2 and "internal error" not in said and "No space left on device" in said, err
    assert str(out / named) in said, err
    if named != ".magmadnn.lock":  # the lock failed before anything was set aside
        assert f"the earlier run in {out} is put back as it was" in said, err
    assert snapshot(out) == before and not _temps(out)


def test_a_full_disk_at_the_lock_of_a_new_folder_leaves_nothing(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, SHORT)
    out = tmp_path / "new" / "run"
    disk_full(monkeypatch, str(out / ".magmadnn.lock"))
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q")
    said = _flat(err)
    assert code == 2 and "internal error" not in said, err
    assert f"{out / '.magmadnn.lock'}: cannot write: No space left on device" in said, err
    assert not (tmp_path / "new").exists()


def test_a_full_disk_at_a_fresh_runs_final_files_leaves_no_half_written_model(capsys, tmp_path, monkeypatch):
    """model.npz is written, then metrics.json finds the disk full: the model without the metrics that
    describe it is not left; the run stays resumable from its checkpoints."""
    config = project(tmp_path, SHORT)
    out = tmp_path / "run"
    disk_full(monkeypatch, str(out / ".metrics.json.*.tmp"))
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q")
    monkeypatch.undo()
    assert code == 2 and f"{out / 'metrics.json'}: cannot write: No space left on device" in _flat(err), err
    assert not (out / "model.npz").exists() and list(out.glob("checkpoints/*.npz")) and not _temps(out)


def test_a_successful_replacement_removes_the_earlier_run_and_says_so(capsys, earlier):
    config, out, before = earlier
    code, out_text, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "--set", "training.epochs=2")
    assert code == 0, err
    assert f"replaces the earlier run in {out}" in _flat(out_text), out_text
    assert not (out / STASH).exists() and snapshot(out) != before
    assert len(list(out.glob("checkpoints/*.npz"))) >= 1


def test_a_replacing_cross_validation_that_fails_puts_the_earlier_run_back(capsys, earlier, monkeypatch):
    config, out, before = earlier
    disk_full(monkeypatch, str(out / ".metrics.csv.*.tmp"))
    code, _, err = run_cli(capsys, "train", config, "--folds", "3", "--out", out, "--overwrite", "-q")
    monkeypatch.undo()
    said = _flat(err)
    assert code == 2 and f"{out / 'metrics.csv'}: cannot write: No space left on device" in said, err
    assert f"the earlier run in {out} is put back as it was" in said, err
    assert snapshot(out) == before and not _temps(out)


@pytest.mark.parametrize("where", [("trials.csv",), ("trials", "1", "model.npz")])
def test_a_replacing_search_that_fails_puts_the_earlier_search_back(capsys, tmp_path, monkeypatch, where):
    """Its results file, or a trial's model: a full disk is not one trial's failure (every trial would
    fail so): the search stops, says the file, and the earlier search is put back."""
    config = project(tmp_path, SHORT + SEARCH)
    out = tmp_path / "s"
    assert run_cli(capsys, "tune", config, "--out", out, "-q")[0] == 0
    before = snapshot(out)
    target = out.joinpath(*where)
    disk_full(monkeypatch, str(target.parent / f".{target.name}.*.tmp"))
    code, _, err = run_cli(capsys, "tune", config, "--out", out, "--overwrite", "-q")
    monkeypatch.undo()
    said = _flat(err)
    assert code == 2 and f"{target}: cannot write: No space left on device" in said, err
    assert f"the earlier search in {out} is put back as it was" in said, err
    assert snapshot(out) == before and not _temps(out)


def test_a_persons_own_file_in_a_replaced_run_folder_stays_where_it_is(capsys, earlier):
    config, out, _ = earlier
    (out / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q",
                           "--set", "optimizer.learning_rate=1e30", "--set", "optimizer.type=sgd")
    assert code == 2 and (out / "notes.txt").read_text() == "mine", err
    assert run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q")[0] == 0
    assert (out / "notes.txt").read_text() == "mine" and not (out / STASH).exists()


def _killed_while_replacing(out: Path) -> None:
    """What a replacing run killed mid-training leaves (SIGKILL, an MPI abort): the earlier run set
    aside, the killed run's marker, config and a checkpoint, and the dead process's lock."""
    import json
    import subprocess
    import sys

    from magmadnn_cli.training.run_folder import FolderLock, RunFolder
    lock = FolderLock(out, "run", replace=True)
    lock.__enter__()
    (out / "config.yaml").write_text("killed: run\n")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "step00000003.npz").write_bytes(b"PK\x03\x04 of the killed run")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = json.loads(RunFolder(out).lock.read_text())
    RunFolder(out).lock.write_text(json.dumps({**holder, "pid": dead.pid, "started": 1}))


def test_the_launcher_puts_back_the_run_a_killed_job_was_replacing(capsys, earlier):
    from magmadnn_cli.commands.launch.job_end import killed_job_message
    _, out, before = earlier
    _killed_while_replacing(out)
    said = _flat(killed_job_message(signal.SIGKILL, out))
    assert f"the earlier run in {out}, which it was replacing (--overwrite), is put back as it was" in said, said
    assert snapshot(out) == before


def test_a_later_overwrite_keeps_the_run_a_killed_one_was_replacing(capsys, earlier):
    config, out, before = earlier
    _killed_while_replacing(out)
    code, _, err = run_cli(capsys, "predict", out, out.parent / "blobs.csv")
    assert code == 2 and f"the earlier run it was replacing is kept whole in {out / STASH}" in _flat(err), err
    code, _, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q",
                           "--set", "optimizer.learning_rate=1e30", "--set", "optimizer.type=sgd")
    assert code == 2 and f"the earlier run in {out} is put back as it was" in _flat(err), err
    assert snapshot(out) == before
    _killed_while_replacing(out)
    assert run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q")[0] == 0
    assert not (out / STASH).exists() and (out / "config.yaml").read_text() != "killed: run\n"
