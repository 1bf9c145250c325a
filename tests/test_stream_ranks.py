"""Streamed epochs on several ranks (issue 48): rank r reads blocks r, r+N, ... of the file (those it
encoded and cached in the fitting pass), every epoch, and the ranks exchange the rows of each global batch, so N ranks train one process's weights
(float64: equal to 1e-12) and no rank reads every block."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import yaml

from conftest import assert_same_weights, find_mpiexec, run_train
from magmadnn_cli.training.stream_trainer import EpochPlan, OwnedRows
from test_stream_train import _write, small_blocks  # noqa: F401  (a fixture)

MPIEXEC = find_mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec in this environment")

# The CLI with small blocks and a small shuffle buffer (rows mixed across blocks), each rank logging
# the blocks it reads for training (`OwnedRows.load`) to BLOCK_LOG.rank<r>.
LAUNCH = """\
import os
from magmadnn_cli.data import stream, stream_prepare
from magmadnn_cli.distributed.comm import launched_rank
from magmadnn_cli.training import stream_trainer
stream.BLOCK_BYTES = 2000
stream_prepare.BUFFER_ROWS = 128
log = os.environ.get("BLOCK_LOG")
if log:
    load = stream_trainer.OwnedRows.load
    def logged(self, k):
        with open(f"{log}.rank{launched_rank()}", "a") as out:
            out.write(f"{self.epoch} {self.blocks[k].lo}\\n")
        return load(self, k)
    stream_trainer.OwnedRows.load = logged
from magmadnn_cli.__main__ import main
main()
"""


def _project(tmp_path, kind: str) -> tuple:
    data = _write(tmp_path, kind)
    cfg = {"name": "ranks", "seed": 11, "precision": "float64",
           "data": {"train": str(data), "target": "label", "stream": True, "validation_split": 0.15,
                    "test_split": 0.1},
           "model": {"layers": [{"type": "dense", "units": 12, "activation": "relu"}, {"type": "dropout", "rate": 0.2},
                                {"type": "dense", "units": 2, "activation": "softmax"}]},
           "loss": "cross_entropy", "optimizer": {"type": "adam", "learning_rate": 0.01},
           "training": {"epochs": 3, "batch_size": 29, "checkpoint": None}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "launch.py").write_text(LAUNCH)
    return tmp_path / "c.yaml", (str(tmp_path / "launch.py"),)


def _reads(log, ranks: int) -> list[dict[int, set[int]]]:
    """Per rank: epoch -> the blocks (by their first byte or row group) it read for training."""
    found = []
    for r in range(ranks):
        by_epoch: dict[int, set[int]] = collections.defaultdict(set)
        for line in (log.parent / f"{log.name}.rank{r}").read_text().splitlines():
            epoch, block = map(int, line.split())
            by_epoch[epoch].add(block)
        found.append(by_epoch)
    return found


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.usefixtures("small_blocks")
def test_the_plan_gives_the_rows_one_process_reads(tmp_path, shuffle):
    """`EpochPlan` (computed without reading) and `OwnedRows` (blocks read as needed, rows forgotten
    as used) give the epoch's rows in `StreamSource.epoch`'s order, holding far fewer than all; from
    a resumed position, the rest of them, without reading the blocks used up before it."""
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data.stream_prepare import prepare_streamed
    data = prepare_streamed(DataConfig(train=_write(tmp_path, "csv"), target="label", validation_split=0.2),
                            "classification", 4)
    source, like = data.train.x.source, (np.empty((0, data.sample_shape[0]), data.train.x.dtype), data.train.y[:0])
    for epoch, skip in ((1, 0), (2, 0), (2, 500)):
        _, x, y = (np.concatenate(parts) for parts in zip(*source.epoch(epoch, shuffle)))
        plan = EpochPlan(source, epoch, shuffle)
        owned, got, held, loaded = OwnedRows(source, plan), [], [], []
        real = owned.load
        owned.load = lambda k: loaded.append(k) or real(k)
        for _, xp, yp in owned.batches(plan.pieces, skip, 50, like):
            got.append((xp, yp))
            held.append(sum(len(r[0]) for r in owned.rows.values()))
        np.testing.assert_array_equal(np.concatenate([a for a, _ in got]), x[skip:])
        np.testing.assert_array_equal(np.concatenate([b for _, b in got]), y[skip:])
        assert not owned.rows and not owned.pending  # every row given out, nothing left
        assert max(held) < len(x) / 3 and len(loaded) == len(set(loaded))
        assert (len(loaded) < len(plan.blocks)) == (skip > 0)  # blocks used up before the position: not read


@pytest.mark.parametrize("kind, ranks, sets", [
    ("csv", 2, []),  # strategy auto: shared_memory on one node
    ("parquet", 3, ["distributed.strategy=allreduce", "training.gradient_accumulation_steps=2"]),
])
@pytest.mark.mpi
@needs_mpi
def test_ranks_stream_disjoint_blocks_and_train_one_process_weights(tmp_path, kind, ranks, sets):
    config, launch = _project(tmp_path, kind)
    one = run_train(tmp_path / "one", sets, config=config, launcher=launch)
    assert one.returncode == 0, one.stderr
    log = tmp_path / "blocks"
    many = run_train(tmp_path / "many", sets, ranks, config=config, launcher=launch, extra_env={"BLOCK_LOG": str(log)})
    assert many.returncode == 0, many.stderr
    assert_same_weights(tmp_path / "many", tmp_path / "one", 1e-12)
    reads = _reads(log, ranks)
    for epoch in (1, 2, 3):
        per_rank = [reads[r][epoch] for r in range(ranks)]
        everything = set().union(*per_rank)
        assert sum(len(s) for s in per_rank) == len(everything) > 6  # each block read once, by one rank
        assert all(0 < len(s) < len(everything) for s in per_rank)  # every rank reads, none reads them all
        in_file = sorted(everything)  # (blocks by their first byte or row group)
        assert all(s == set(in_file[r::ranks]) for r, s in enumerate(per_rank))  # the blocks it cached: on any node


@pytest.mark.mpi
@needs_mpi
def test_asynchronous_sgd_is_refused_naming_data_stream(tmp_path):
    config, launch = _project(tmp_path, "csv")
    done = run_train(tmp_path / "async", ["distributed.strategy=async"], 2, config=config, launcher=launch)
    assert done.returncode == 2, done.stderr
    assert "distributed.strategy async" in done.stderr and "data.stream: false" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.mpi
@needs_mpi
def test_two_ranks_resume_one_process_checkpoint_mid_epoch(tmp_path):
    """A streamed checkpoint holds no rank count: 2 ranks go on from one process's, mid-epoch, to its weights."""
    config, launch = _project(tmp_path, "csv")
    one = run_train(tmp_path / "one", ["training.checkpoint.every_steps=13", "training.checkpoint.keep=100"],
                    config=config, launcher=launch)
    assert one.returncode == 0, one.stderr
    mid = sorted((tmp_path / "one" / "checkpoints").glob("step*.npz"))[3]  # step 52: in epoch 2 of 3
    position = json.loads(str(np.load(mid)["meta"]))["state"]["trainer"]["position"]
    assert position["epoch"] == 2 and position["step"] > 0
    many = run_train(tmp_path / "many", [], 2, config=config, launcher=launch, extra=("--resume", str(mid)))
    assert many.returncode == 0, many.stderr
    assert_same_weights(tmp_path / "many", tmp_path / "one", 1e-12)


@pytest.mark.usefixtures("small_blocks")
def test_a_ranks_blocks_are_read_ahead_of_the_steps(tmp_path, capsys, monkeypatch):
    """Each epoch, the blocks this rank reads are read and encoded in the background, in the order
    it takes them (`StreamSource.ahead`); a resumed epoch reads ahead only those it still needs."""
    from conftest import run_cli
    from magmadnn_cli.data import stream, stream_cache
    from magmadnn_cli.data.stream_prepare import StreamSource
    asked, served = [], []
    real_ahead, real_get = StreamSource.ahead, stream.Prefetcher.get

    def ahead(self, order, code):
        asked.append((code, len(order)))
        return real_ahead(self, order, code)

    def get(self, block):
        found = real_get(self, block)
        served.append(found is not None)
        return found
    monkeypatch.setattr(StreamSource, "ahead", ahead)
    monkeypatch.setattr(stream.Prefetcher, "get", get)
    monkeypatch.setattr(stream_cache, "room_for", lambda nbytes, folder=None: False)  # blocks parsed: read ahead
    config, _ = _project(tmp_path, "csv")
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "--set", "training.epochs=2",
                             "--set", "training.checkpoint.every_steps=25", "--set", "training.checkpoint.keep=10")
    assert code == 0, out + err
    epochs = [n for c, n in asked if c == stream.TRAIN]
    assert len(epochs) == 3 and epochs[0] == epochs[1] == epochs[2] > 6  # every block, each epoch (and the report)
    assert sum(served) >= 0.9 * len(served)  # read ahead, not where the step waits
    asked.clear()
    mid = tmp_path / "run" / "checkpoints" / "step00000050.npz"  # in the middle of epoch 2
    code, out, err = run_cli(capsys, "train", config, "--resume", mid, "--out", tmp_path / "resumed")
    assert code == 0, out + err
    assert 0 < [n for c, n in asked if c == stream.TRAIN][0] < epochs[0]
