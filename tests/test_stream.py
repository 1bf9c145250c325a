"""The pieces of streamed epochs (issue 48, item 2; data/stream.py): blocks that cover a file's rows
exactly once, held-out rows by a hash of position and seed, an epoch's order that is a function of
the seed and epoch only with a bounded buffer, and bounded statistics against numpy on all rows."""

from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data import stream
from magmadnn_cli.data.cells import canonical
from magmadnn_cli.data.metrics import Moments
from magmadnn_cli.data.readers import read_table
from magmadnn_cli.data.table import ReadSpec
from magmadnn_cli.errors import DataError


def _table(rows: int = 997) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(rows)
    a[rng.random(rows) < 0.05] = np.nan
    return {"a": a, "b": rng.integers(0, 100, rows).astype(float),
            "kind": np.array(["red", "green", "blue"])[rng.integers(0, 3, rows)],
            "label": np.array(["x", "y"])[rng.integers(0, 2, rows)]}


@pytest.fixture
def files(tmp_path):
    cols = _table()
    csv = tmp_path / "t.csv"
    lines = ["a,b,kind,label"] + [f"{'' if np.isnan(a) else repr(float(a))},{b:g},{k},{y}"
                                  for a, b, k, y in zip(cols["a"], cols["b"], cols["kind"], cols["label"])]
    csv.write_text("\n".join(lines) + "\n")
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table(cols), parquet, row_group_size=100)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps({"a": None if np.isnan(a) else float(a), "b": b, "kind": k, "label": y}) + "\n"
                             for a, b, k, y in zip(cols["a"], cols["b"], cols["kind"], cols["label"])))
    return csv, parquet, jsonl


def _spec(path) -> ReadSpec:
    return ReadSpec.of(DataConfig(train=path, target="label"))


@pytest.mark.parametrize("kind", ["csv", "parquet", "jsonl"])
@pytest.mark.parametrize("block_bytes", [1, 700, 5000, 1 << 20])
def test_blocks_cover_every_row_once_in_order(files, kind, block_bytes):
    path = files[["csv", "parquet", "jsonl"].index(kind)]
    whole = read_table(path, _spec(path))
    spec = _spec(path)
    read = list(stream.counted(stream.BlockFile.of(path, spec), stream.blocks_of(path, spec, block_bytes)))
    assert len(read) > 1 or block_bytes > path.stat().st_size
    x = np.concatenate([t.raw.x for _, t in read])
    np.testing.assert_array_equal(x, whole.raw.x)
    assert np.concatenate([t.y for _, t in read]).tolist() == whole.y.tolist()
    assert [b.first_row for b, _ in read] == list(np.cumsum([0] + [b.rows for b, _ in read[:-1]]))
    np.testing.assert_array_equal(np.concatenate([t.raw.row_ids for _, t in read]), np.arange(len(whole.y)))
    texts = [np.concatenate([t.raw.text[j] for _, t in read]) for j in whole.raw.text]
    assert [t.tolist() for t in texts] == [whole.raw.text[j].tolist() for j in whole.raw.text]


def test_a_compressed_csv_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="cannot be cut into blocks.*Parquet.*data.stream: false"):
        stream.blocks_of(path, _spec(path))


@pytest.mark.parametrize("block_bytes", [20, 1 << 20])
def test_a_quoted_line_break_is_named_wherever_the_blocks_fall(tmp_path, block_bytes):
    path = tmp_path / "q.csv"
    path.write_text("a,label\n" + "1,x\n" * 50 + '2,"two\nlines"\n' + "3,y\n" * 50)
    spec = _spec(path)
    with pytest.raises(DataError, match="quoted cell with a line break.*Parquet"):
        list(stream.counted(stream.BlockFile.of(path, spec), stream.blocks_of(path, spec, block_bytes)))


def test_blank_lines_and_a_missing_last_line_break_are_read(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("a,label\r\n1,x\r\n\r\n2,y\n\n3,x")
    spec = _spec(path)
    read = list(stream.counted(stream.BlockFile.of(path, spec), stream.blocks_of(path, spec)))
    assert read[0][1].raw.x[:, 0].tolist() == [1, 2, 3] and read[0][0].rows == 3


def test_held_out_rows_depend_on_position_and_seed_only():
    positions = np.arange(200_000)
    codes = stream.split_codes(positions, 7, 0.1, 0.2)
    shares = np.bincount(codes, minlength=3) / len(codes)
    np.testing.assert_allclose(shares, [0.7, 0.1, 0.2], atol=0.005)
    np.testing.assert_array_equal(stream.split_codes(positions[123:4567], 7, 0.1, 0.2), codes[123:4567])
    assert (stream.split_codes(positions, 8, 0.1, 0.2) != codes).mean() > 0.3


def _blocks(sizes):
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return [stream.Block(i, i + 1, int(s), int(n)) for i, (s, n) in enumerate(zip(starts, sizes))]


def test_an_epoch_is_a_permutation_drawn_from_seed_and_epoch_in_a_bounded_buffer():
    blocks = _blocks([100, 37, 250, 1, 80, 300])
    rows = lambda b: (np.arange(b.first_row, b.first_row + b.rows),)  # noqa: E731
    pieces = [p for p, in stream.epoch_rows(blocks, 3, 1, 128, rows)]
    order = np.concatenate(pieces)
    assert sorted(order.tolist()) == list(range(768))
    assert max(len(p) for p in pieces) <= 128 + 300
    again = np.concatenate([p for p, in stream.epoch_rows(blocks, 3, 1, 128, rows)])
    np.testing.assert_array_equal(order, again)
    other = np.concatenate([p for p, in stream.epoch_rows(blocks, 3, 2, 128, rows)])
    assert (other != order).mean() > 0.5
    mixed = np.abs(np.diff(order)) != 1  # rows of one block are mixed, not read out in file order
    assert mixed.mean() > 0.9


@pytest.mark.parametrize("cuts", [[1000], [1, 999], [10, 300, 690], [500, 500]])
def test_moments_merged_by_block_are_numpys_on_all_rows(cuts):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 3)) * [1, 1e3, 1e-3] + [0, 1e6, 5]
    x[rng.random((1000, 3)) < 0.1] = np.nan
    moments = Moments()
    for part in np.split(x, np.cumsum(cuts)[:-1]):
        moments.add(part)
    np.testing.assert_allclose(moments.mean, np.nanmean(x, axis=0), rtol=1e-12)
    np.testing.assert_allclose(moments.variance, np.nanvar(x, axis=0), rtol=1e-9)
    np.testing.assert_array_equal(moments.count, (~np.isnan(x)).sum(axis=0))


def test_a_json_lines_block_whose_values_change_type_is_read_as_text_cells(tmp_path):
    """pyarrow types a block by the file's first MiB; a block where a number column holds text is
    read record by record, as the in-memory reader goes on."""
    path = tmp_path / "m.jsonl"
    records = [{"a": i * 0.5, "kind": "x", "label": "p" if i % 3 else "q"} for i in range(300)]
    records[250]["a"] = "abc"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = _spec(path)
    whole = read_table(path, spec)
    read = list(stream.counted(stream.BlockFile.of(path, spec), stream.blocks_of(path, spec, 2000)))
    assert len(read) > 3
    cells = canonical(np.concatenate([t.raw.cells(0) for _, t in read]))  # as categories spell them
    assert cells.tolist() == canonical(whole.raw.cells(0)).tolist() and "abc" in cells.tolist()
    assert np.concatenate([t.y for _, t in read]).tolist() == whole.y.tolist()


def test_a_csv_is_sniffed_once_and_a_parquet_file_opened_once_a_pass(files, monkeypatch):
    from magmadnn_cli.data.stream_prepare import prepare_streamed
    sniffs, opens = [], []
    csv_format, parquet_file = ReadSpec.csv_format, pq.ParquetFile
    monkeypatch.setattr(ReadSpec, "csv_format", lambda self, path: sniffs.append(path) or csv_format(self, path))
    monkeypatch.setattr(stream.pq, "ParquetFile", lambda *a, **k: opens.append(a) or parquet_file(*a, **k))
    data = prepare_streamed(DataConfig(train=files[0], target="label"), "classification", 1, block_bytes=700)
    source = data.train.x.source
    assert len(source.blocks) > 20 and len(sniffs) <= 2, len(sniffs)
    list(source.epoch(1, True))
    assert len(sniffs) <= 2
    data = prepare_streamed(DataConfig(train=files[1], target="label"), "classification", 1)
    source, opens[:] = data.train.x.source, []
    assert len(list(source.epoch(1, True))) and len(source.blocks) == 10 and len(opens) == 1


def _work(log: list, gate: dict[int, threading.Event], fail: int = -1):
    def work(block):
        log.append(block.lo)
        gate.setdefault(block.lo, threading.Event()).set()
        if block.lo == fail:
            raise ValueError(f"block {fail}")
        return block.lo * 10
    return work


def test_read_ahead_is_bounded_ordered_and_gives_each_result_to_its_block():
    blocks = [stream.Block(i, i + 1) for i in range(8)]
    log, gate = [], {i: threading.Event() for i in range(8)}
    ahead = stream.Prefetcher(_work(log, gate), blocks, depth=2)
    assert gate[2].wait(10)  # read ahead before anything is asked: two queued, a third waiting to be
    assert not gate[3].is_set() and log == [0, 1, 2]
    assert ahead.get(blocks[0]) == 0 and ahead.get(blocks[3]) == 30  # 1 and 2 never asked: dropped
    assert ahead.get(blocks[1]) is None  # passed over: the caller reads it itself
    assert ahead.get(stream.Block(99, 100)) is None
    assert [ahead.get(b) for b in blocks[4:]] == [40, 50, 60, 70] and log == list(range(8))
    ahead.close()
    assert not ahead.thread.is_alive()


def test_an_error_ahead_is_raised_for_its_block_in_the_callers_thread():
    blocks = [stream.Block(i, i + 1) for i in range(5)]
    ahead = stream.Prefetcher(_work([], {}, fail=2), blocks)
    assert ahead.get(blocks[0]) == 0 and ahead.get(blocks[1]) == 10
    with pytest.raises(ValueError, match="block 2"):
        ahead.get(blocks[2])
    assert ahead.get(blocks[3]) is None  # the thread stopped at the error: the caller reads the rest
    ahead.close()
    assert not ahead.thread.is_alive()
    skipped = stream.Prefetcher(_work([], {}, fail=1), blocks)
    assert skipped.get(blocks[3]) is None  # an error of a block never asked for is not raised
    skipped.close()


def test_closing_stops_a_thread_waiting_on_a_full_queue():
    blocks = [stream.Block(i, i + 1) for i in range(100)]
    log, gate = [], {}
    ahead = stream.Prefetcher(_work(log, gate), blocks, depth=1)
    assert gate.setdefault(1, threading.Event()).wait(10)
    ahead.close()
    assert not ahead.thread.is_alive() and len(log) < 10


def test_prefetched_gives_works_results_in_order_and_stops_when_the_loop_does():
    blocks = [stream.Block(i, i + 1) for i in range(6)]
    assert list(stream.prefetched(lambda b: b.lo * 2, blocks)) == [0, 2, 4, 6, 8, 10]
    pieces = stream.prefetched(lambda b: b.lo, blocks)
    assert next(pieces) == 0
    pieces.close()  # a loop left early: the thread ends
    assert all(t.name != "magmadnn-read-ahead" for t in threading.enumerate())


def test_block_order_is_the_order_an_epoch_reads_its_blocks():
    """What a trainer hands to `StreamSource.ahead`: the blocks as `epoch_rows` will ask for them."""
    blocks = _blocks([30, 5, 80, 1, 64, 12, 40])
    for epoch in (1, 2, 7):
        asked = []
        list(stream.epoch_rows(blocks, 4, epoch, 16, lambda b: asked.append(b) or (np.arange(b.rows),)))
        assert asked == stream.block_order(blocks, 4, epoch)
    assert stream.block_order(blocks, 4, 1) != stream.block_order(blocks, 4, 2)


def test_an_interrupt_in_the_loop_stops_the_thread_reading_ahead():
    """Ctrl-C (KeyboardInterrupt in the main thread) while a pass reads ahead: the thread stops with it."""
    blocks = [stream.Block(i, i + 1) for i in range(50)]
    log, gate = [], {}
    with pytest.raises(KeyboardInterrupt):
        for value in stream.prefetched(_work(log, gate), blocks):
            assert gate.setdefault(1, threading.Event()).wait(10)  # the next block is being read ahead
            raise KeyboardInterrupt
    assert all(t.name != "magmadnn-read-ahead" for t in threading.enumerate()) and len(log) < 5


def test_a_parquet_file_is_read_without_mapping_it_whole(files, monkeypatch):
    """A memory map counts against the address-space limit (ulimit -v): a Parquet file larger than it
    could not be opened to stream it (issue 48's 10 GB run), so streaming maps none."""
    opened, parquet_file = [], pq.ParquetFile
    monkeypatch.setattr(pq, "ParquetFile", lambda *a, **k: opened.append(k) or parquet_file(*a, **k))
    spec = _spec(files[1])
    reads, read_schema = [], pq.read_schema
    monkeypatch.setattr(pq, "read_schema", lambda *a, **k: reads.append(k) or read_schema(*a, **k))
    list(stream.counted(stream.BlockFile.of(files[1], spec), stream.blocks_of(files[1], spec)))
    assert opened and reads and not any(k.get("memory_map") for k in opened + reads)
