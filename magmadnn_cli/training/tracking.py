"""Runs reach TensorBoard and MLflow (`tracking:` in the config). A reporter wrapper passes on what the
trainer reports and tells the run's trackers each epoch's metrics (step = the epoch number:
train/<metric>, validation/<metric>, learning_rate) and every N-th update's batch loss (step/loss,
step = the global update count); they start with the resolved config (text and hyperparameters,
parameters) and end with the run: FINISHED (MLflow then stores the run's files), KILLED or FAILED.

Only rank 0 tracks. A resumed run continues the logs and never logs a (tag, step) twice (TensorBoard
would draw a zigzag): what the earlier run logged is read back first. A tracker that cannot start is a
clear error before the first step; one that fails later is a warning, and the training goes on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Protocol

import yaml

from ..config.schema import Config, Tracking
from ..distributed import Communicator
from ..errors import Interrupted, MagmaError
from ..files import cannot_write, write_text
from ..reporting import Reporter
from . import events
from .run_folder import RunFolder

MLFLOW_EXTRA = "pip install 'magmadnn-cli[mlflow]'"
SUFFIX = ".magmadnn"  # our events files: a fresh run removes only these
OWNER = ".magmadnn-run"  # in a shared log folder's subfolder: the run folder whose events it holds


class TrackerUnavailable(MagmaError):
    """A tracker whose server cannot be reached as the run begins: said once, and the run goes on."""


class Tracker(Protocol):
    def begin(self, params: dict[str, Any], config_text: str) -> None: ...
    def log(self, step: int, values: dict[str, float]) -> None: ...
    def sync(self) -> None: ...
    def end(self, status: str, outputs: Path | None) -> None: ...


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """The config as dotted keys (`model.layers.0.units`); an empty list or mapping as its JSON."""
    if isinstance(value, (dict, list)) and value:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return {key: v for k, item in items for key, v in flatten(item, f"{prefix}.{k}" if prefix else str(k)).items()}
    return {prefix: json.dumps(value) if isinstance(value, (dict, list)) else value}


def epoch_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """An epoch's metrics as the trainer reports them, under their tracking names."""
    names = {"lr": "learning_rate", "batch_size": "batch_size"}
    return {names.get(k) or (f"validation/{k[4:]}" if k.startswith("val_") else f"train/{k}"): float(v)
            for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# -- TensorBoard -----------------------------------------------------------------------------------
class TensorBoard:
    """A new events file in `folder` per run start. A fresh run first removes the event files an
    earlier run wrote there (TensorBoard would mix the two); a resumed run skips every (tag, step)
    they hold. `folder` is the run's own (in its run folder) or, in a shared log folder, the run's
    subfolder there, marked with its `owner`. Each record is one write of its whole framing;
    fsynced after each epoch."""

    def __init__(self, folder: Path, resumed: bool, reporter: Reporter, owner: str | None = None) -> None:
        """`folder`: the run's own events folder, or (with `owner`, the run folder) the shared log folder
        in which the run claims a subfolder when it begins."""
        self.folder, self.resumed, self.reporter, self.owner = folder, resumed, reporter, owner
        self.fd: int | None = None
        self.written: set[tuple[str, int]] = set()

    def begin(self, params: dict[str, Any], config_text: str) -> None:
        try:
            if self.owner is not None:  # a shared folder: claimed now, not when the run was set up
                self.folder = run_subfolder(self.folder, Path(self.owner))
            self.folder.mkdir(parents=True, exist_ok=True)
            ours = sorted(self.folder.glob(f"events.out.tfevents.*{SUFFIX}"))
            if self.resumed:
                self.written = set().union(*(events.tags_and_steps(p) for p in ours))
            else:
                for path in ours:
                    path.unlink()
                if ours:
                    self.reporter.info(f"removed {len(ours)} TensorBoard event file(s) of an earlier run in {self.folder}")
            path = self.folder / f"events.out.tfevents.{self._stamp():010d}.{socket.gethostname()}.{os.getpid()}{SUFFIX}"
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
        except OSError as exc:
            raise MagmaError(f"tracking.tensorboard: {cannot_write(self.folder, exc)}") from exc
        self.reporter.info(f"TensorBoard events in {self.folder} (view: tensorboard --logdir {self.folder})")
        now = time.time()
        self._write(events.event(now, file_version=events.FILE_VERSION))
        hyper = {k: v for k, v in params.items() if v is not None}
        for tag, value in (("config", events.text("config", f"```yaml\n{config_text}```")),
                           (events.HPARAMS_TAG, events.hparams(hyper, now))):
            if (tag, 0) not in self.written:
                self._write(events.event(now, 0, events.summary(value)))
        self.sync()

    def _stamp(self) -> int:
        """The file's time in its name, later than every events file there: files are read in name order."""
        stamps = [int(p.name.split(".")[3]) for p in self.folder.glob("events.out.tfevents.*")
                  if p.name.split(".")[3:4] and p.name.split(".")[3].isdigit()]
        return max([int(time.time()), *(s + 1 for s in stamps)])

    def log(self, step: int, values: dict[str, float]) -> None:
        new = [events.scalar(tag, v) for tag, v in values.items() if (tag, step) not in self.written]
        if new:
            self._write(events.event(time.time(), step, events.summary(*new)))
            self.written |= {(tag, step) for tag in values}

    def _write(self, payload: bytes) -> None:
        data = memoryview(events.record(payload))
        while data and self.fd is not None:
            data = data[os.write(self.fd, data):]

    def sync(self) -> None:
        if self.fd is not None:
            os.fsync(self.fd)

    def end(self, status: str, outputs: Path | None) -> None:
        if self.fd is not None:
            self.sync()
            os.close(self.fd)
            self.fd = None


# -- the reporter that tracks ----------------------------------------------------------------------
class TrackingReporter(Reporter):
    """`inner` reports as before; the trackers hear of each epoch and every `every`-th update."""

    def __init__(self, inner: Reporter, trackers: list[Tracker], every: int, config: Config) -> None:
        super().__init__(inner.console, inner.warnings)
        self.inner, self.trackers, self.every, self.config = inner, trackers, every, config
        self.begun: list[Tracker] = []

    def start(self, epochs: int) -> None:
        self.inner.start(epochs)
        if not self.begun:  # lazily: a run refused by its checks leaves no log
            dumped = self.config.model_dump(mode="json")
            text = yaml.safe_dump(dumped, sort_keys=False)
            for tracker in self.trackers:
                try:
                    tracker.begin(flatten(dumped), text)
                except TrackerUnavailable as exc:
                    self.inner.warn(f"{exc}; the run goes on without it")
                    continue
                self.begun.append(tracker)

    def step(self, epoch: int, step: int, steps: int, loss: float, accuracy: float | None) -> None:
        self.inner.step(epoch, step, steps, loss, accuracy)

    def optimizer_step(self, global_step: int, loss: float) -> None:
        if global_step % self.every == 0:
            self._each(lambda t: t.log(global_step, {"step/loss": loss}))

    def epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        self.inner.epoch(epoch, metrics)
        values = epoch_scalars(metrics)
        self._each(lambda t: (t.log(epoch, values), t.sync()))

    def stop(self) -> None:
        self.inner.stop()
        self._each(lambda t: t.sync())

    def info(self, text: str) -> None:
        self.inner.info(text)

    def done(self, text: str) -> None:
        self.inner.done(text)

    def warn(self, text: str) -> None:
        self.inner.warn(text)

    def table(self, table: Any) -> None:
        self.inner.table(table)

    def _each(self, call: Any) -> None:
        """Tell every started tracker; one that fails is said once and dropped (training goes on)."""
        for tracker in list(self.begun):
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001  a disk, a server: the run is worth more than its log
                self.begun.remove(tracker)
                self.inner.warn(f"tracking: {type(tracker).__name__} stopped logging: {exc}")

    def end(self, status: str, outputs: Path | None) -> None:
        self._each(lambda t: t.end(status, outputs))


# -- from the config -------------------------------------------------------------------------------
def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_tracking(tracking: Tracking | None) -> None:
    """What a tracker needs and the config cannot say (on every rank, before the run's checks)."""
    if tracking is None or tracking.mlflow is None:
        return
    if not _installed("mlflow"):
        raise MagmaError(f"tracking.mlflow: MLflow is not installed; install it with: {MLFLOW_EXTRA} "
                         "(or remove tracking.mlflow)")
    if not (tracking.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
        raise MagmaError("tracking.mlflow: no tracking_uri and MLFLOW_TRACKING_URI is not set; give one, e.g. "
                         "tracking.mlflow.tracking_uri: http://localhost:5000")


def trackers(config: Config, out_dir: Path, resumed: bool, reporter: Reporter) -> list[Tracker]:
    tracking, found = config.tracking, []
    if tracking is not None and tracking.tensorboard is not False:
        folder = out_dir / (Path(RunFolder.TENSORBOARD) if tracking.tensorboard is True else  # an absolute one stays itself
                            Path(os.path.expandvars(str(tracking.tensorboard))).expanduser())
        inside = os.path.abspath(folder).startswith(os.path.join(os.path.abspath(out_dir), ""))
        owner = None if inside else os.path.abspath(out_dir)
        found.append(TensorBoard(folder, resumed, reporter, owner))
    if tracking is not None and tracking.mlflow is not None:
        from .mlflow_tracking import Mlflow  # imports mlflow when it begins
        found.append(Mlflow(tracking.mlflow, config.name, out_dir, resumed))
    return found


def run_subfolder(logdir: Path, out_dir: Path) -> Path:
    """A shared log folder's subfolder for this run, named after its run folder (as Lightning's
    versions), claimed: the one whose owner file names this run folder, else the first this run
    creates itself (mkdir is atomic: of two runs of one name starting together, each gets its own;
    a run folder of the same name elsewhere gets <name>-2, ...). The owner file is written at once."""
    owner = os.path.abspath(out_dir)
    logdir.mkdir(parents=True, exist_ok=True)
    for k in itertools.count(1):
        sub = logdir / (out_dir.name if k == 1 else f"{out_dir.name}-{k}")
        try:
            sub.mkdir()
        except FileExistsError:
            if _owner(sub) == owner:
                return sub
            continue
        write_text(sub / OWNER, owner)
        return sub
    raise AssertionError("unreachable")


def _owner(sub: Path) -> str | None:
    """The run folder a shared log subfolder's owner file names (None: none, or another's being made)."""
    try:
        return (sub / OWNER).read_text()
    except OSError:
        return None


@contextlib.contextmanager
def tracked(reporter: Reporter, config: Config, out_dir: Path, comm: Communicator,
            resumed: bool) -> Iterator[Reporter]:
    """`reporter`, tracking the run on rank 0 when the config asks; the trackers end with the block."""
    check_tracking(config.tracking)
    found = trackers(config, out_dir, resumed, reporter) if comm.is_root else []
    if not found:
        yield reporter
        return
    tracking = TrackingReporter(reporter, found, config.tracking.log_every_steps, config)
    try:
        yield tracking
    except BaseException as exc:
        tracking.end("KILLED" if isinstance(exc, (Interrupted, KeyboardInterrupt)) else "FAILED", None)
        raise
    tracking.end("FINISHED", out_dir)
