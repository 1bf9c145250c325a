"""The streamed run's fitting passes split over the ranks (issue 48): rank r surveys and encodes
blocks r, r+N, ... of the file; the statistics are merged exactly (block by block in file order), so
N ranks fit what one process fits, bitwise, and train its weights; no rank reads every block."""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest

from conftest import assert_same_weights, find_mpiexec, run_train
from magmadnn_cli.data import stream
from magmadnn_cli.data.stream_fit import FitRanks
from test_stream_ranks import _project
from test_stream_train import _write, small_blocks  # noqa: F401  (a fixture)

MPIEXEC = find_mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec in this environment")


class ThreadRanks:
    """N ranks as N threads of this process: `gathered` waits for every thread's value (a barrier)."""

    def __init__(self, n: int) -> None:
        self.n, self.values, self.barrier = n, [None] * n, threading.Barrier(n, timeout=60)

    def rank(self, r: int) -> FitRanks:
        return FitRanks(r, self.n, lambda make: self._gathered(r, make()))

    def _gathered(self, r: int, value):
        self.values[r] = value
        self.barrier.wait()
        out = list(self.values)
        self.barrier.wait()
        return out


def _fits(data, task: str, seed: int, ranks: int, monkeypatch) -> tuple[list, dict[int, list[int]]]:
    """`prepare_streamed` on `ranks` thread ranks: each rank's result, and the blocks each parsed."""
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data.stream_prepare import prepare_streamed
    reads: dict[int, list[int]] = collections.defaultdict(list)
    here = threading.local()
    real = stream.BlockFile.reader

    def reader(self):
        read, rank = real(self), getattr(here, "rank", 0)
        return lambda block, first: reads[rank].append(block.lo) or read(block, first)
    monkeypatch.setattr(stream.BlockFile, "reader", reader)
    cfg = DataConfig(train=data, target="label", validation_split=0.15, test_split=0.1)
    group, found = ThreadRanks(ranks), [None] * ranks

    def run(r: int) -> None:
        here.rank = r
        found[r] = prepare_streamed(cfg, task, seed, ranks=group.rank(r))
    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert all(f is not None for f in found)
    return found, reads


def _same_fit(a, b) -> None:
    """Bitwise the same normalizer, categories, fills, classes and split targets."""
    assert a.classes == b.classes and a.features == b.features and a.task == b.task
    for name in ("shift", "spread"):
        np.testing.assert_array_equal(getattr(a.normalizer, name), getattr(b.normalizer, name))
    assert [(c.name, c.kind, c.categories, repr(c.fill)) for c in a.encoder.columns] == \
        [(c.name, c.kind, c.categories, repr(c.fill)) for c in b.encoder.columns]
    for split in ("train", "validation", "test"):
        np.testing.assert_array_equal(np.asarray(getattr(a, split).y), np.asarray(getattr(b, split).y))
    assert a.train.x.source.blocks == b.train.x.source.blocks


@pytest.mark.parametrize("kind, ranks", [("csv", 2), ("parquet", 3), ("jsonl", 2)])
@pytest.mark.usefixtures("small_blocks")
def test_ranks_fit_one_process_fit_reading_disjoint_blocks(tmp_path, monkeypatch, kind, ranks):
    data = _write(tmp_path, kind)
    (one,), one_reads = _fits(data, "classification", 4, 1, monkeypatch)
    blocks = len(one.train.x.source.blocks)
    assert blocks > 6 and len(one_reads[0]) == 2 * blocks  # one process: the survey and the encoding pass
    many, reads = _fits(data, "classification", 4, ranks, monkeypatch)
    for found in many:
        _same_fit(found, one)
    per_rank = [collections.Counter(reads[r]) for r in range(ranks)]
    assert all(0 < len(c) < blocks for c in per_rank)  # every rank reads, none reads them all
    assert sum(len(c) for c in per_rank) == blocks and all(set(c.values()) == {2} for c in per_rank)
    # the epochs read from the ranks' caches: every rank sees each block's encoded rows, as one process
    for found in many:
        source = found.train.x.source
        for block in source.blocks:
            got, want = source.cache.get((block, stream.TRAIN)), one.train.x.source.cache.get((block, stream.TRAIN))
            np.testing.assert_array_equal(got[0], want[0]), np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.usefixtures("small_blocks")
def test_regression_targets_scaled_alike_on_ranks(tmp_path, monkeypatch):
    """A regression target's scaling (the training targets' moments) is one process's."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(2)
    rows = 900
    pq.write_table(pa.table({"a": rng.standard_normal(rows), "kind": rng.choice(["x", "y", "z"], rows),
                             "label": rng.standard_normal(rows) * 3 + 1}), tmp_path / "r.parquet", row_group_size=61)
    (one,), _ = _fits(tmp_path / "r.parquet", "regression", 9, 1, monkeypatch)
    many, _ = _fits(tmp_path / "r.parquet", "regression", 9, 3, monkeypatch)
    for found in many:
        np.testing.assert_array_equal(found.targets.shift, one.targets.shift)
        np.testing.assert_array_equal(found.targets.spread, one.targets.spread)
        _same_fit(found, one)


def _fit_reads(log, ranks: int) -> list[set[int]]:
    return [set(int(line) for line in (log.parent / f"{log.name}.rank{r}").read_text().split()) for r in range(ranks)]


FIT_LOG = """\
import os
from magmadnn_cli.data import stream
from magmadnn_cli.distributed.comm import launched_rank
real = stream.BlockFile.reader
def reader(self):
    read = real(self)
    def logged(block, first):
        if os.environ.get("FIT_LOG"):
            with open(f"{os.environ['FIT_LOG']}.rank{launched_rank()}", "a") as out:
                out.write(f"{block.lo}\\n")
        return read(block, first)
    return logged
stream.BlockFile.reader = reader
"""


@pytest.mark.parametrize("kind, ranks", [("csv", 2), ("parquet", 3)])
@pytest.mark.mpi
@needs_mpi
def test_mpi_ranks_split_the_fitting_passes_and_train_one_process_weights(tmp_path, kind, ranks):
    config, launch = _project(tmp_path, kind)
    script = tmp_path / "launch.py"
    script.write_text(FIT_LOG + script.read_text())
    one = run_train(tmp_path / "one", ["training.epochs=2"], config=config, launcher=launch)
    assert one.returncode == 0, one.stderr
    log = tmp_path / "fit"
    many = run_train(tmp_path / "many", ["training.epochs=2"], ranks, config=config, launcher=launch,
                     extra_env={"FIT_LOG": str(log)})
    assert many.returncode == 0, many.stderr
    assert_same_weights(tmp_path / "many", tmp_path / "one", 1e-12)
    reads = _fit_reads(log, ranks)  # every block parsed: in the fitting passes (the epochs read the ranks' caches)
    everything = set().union(*reads)
    assert len(everything) > 6 and all(0 < len(r) < len(everything) for r in reads)  # none reads them all
    assert sum(len(r) for r in reads) == len(everything)  # each block parsed by one rank


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.usefixtures("small_blocks")
def test_the_merged_sample_is_one_passes_bottom_k(tmp_path, ranks):
    """With fewer sample rows than training rows, the ranks' bottom-k samples merge into one pass's:
    the same rows in the same order, the same cells (so the fills, medians included, are exact)."""
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data.stream_fit import survey
    from magmadnn_cli.data.table import ReadSpec
    data = _write(tmp_path, "csv")
    cfg = DataConfig(train=data, target="label", validation_split=0.15, test_split=0.1)
    look = lambda group=FitRanks(): survey(data, ReadSpec.of(cfg), cfg, 4, 2000, sample_rows=77, ranks=group)  # noqa: E731
    one, group, found = look(), ThreadRanks(ranks), [None] * ranks
    threads = [threading.Thread(target=lambda r=r: found.__setitem__(r, look(group.rank(r)))) for r in range(ranks)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    for many in found:
        assert len(many.sample.x) == 77 < one.rows[0] and many.blocks == one.blocks
        np.testing.assert_array_equal(many.sample.row_ids, one.sample.row_ids)
        np.testing.assert_array_equal(many.keys, one.keys)
        np.testing.assert_array_equal(many.sample.x, one.sample.x)
        assert many.sample.text.keys() == one.sample.text.keys()
        assert all((many.sample.text[j] == one.sample.text[j]).all() for j in one.sample.text)
        assert (many.values, many.numbers, many.labels) == (one.values, one.numbers, one.labels)
        np.testing.assert_array_equal(many.rows, one.rows)
