"""The pieces of streamed epochs (issue 48, item 2; data/stream.py): blocks that cover a file's rows
exactly once, held-out rows by a hash of position and seed, an epoch's order that is a function of
the seed and epoch only with a bounded buffer, and bounded statistics against numpy on all rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data import stream
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
    return csv, parquet


def _spec(path) -> ReadSpec:
    return ReadSpec.of(DataConfig(train=path, target="label"))


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize("block_bytes", [1, 700, 5000, 1 << 20])
def test_blocks_cover_every_row_once_in_order(files, kind, block_bytes):
    path = files[0] if kind == "csv" else files[1]
    whole = read_table(path, _spec(path))
    spec = _spec(path)
    read = list(stream.counted(path, spec, stream.blocks_of(path, spec, block_bytes)))
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
        list(stream.counted(path, spec, stream.blocks_of(path, spec, block_bytes)))


def test_blank_lines_and_a_missing_last_line_break_are_read(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("a,label\r\n1,x\r\n\r\n2,y\n\n3,x")
    spec = _spec(path)
    read = list(stream.counted(path, spec, stream.blocks_of(path, spec)))
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
