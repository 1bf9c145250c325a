"""Parquet and Feather files read in batches without memory-mapping them (issue 48): a map of the
whole file counts against `ulimit -v` (address space), so `predict` or `evaluate` on a file larger
than the address-space limit would fail though it reads in bounded batches. While a reader is open
(after its first batch), /proc/self/maps must hold no mapping of the file."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli

pa = pytest.importorskip("pyarrow")
import pyarrow.feather as feather
import pyarrow.parquet as pq

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/self/maps").exists(),
                                reason="reads /proc/self/maps (Linux)")
ROWS = 2000


def mapped(path: Path) -> list[str]:
    """This process's mappings of `path` (lines of /proc/self/maps)."""
    target = str(Path(path).resolve())
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(target)]


def _table(rows: int = ROWS, seed: int = 0) -> "pa.Table":
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(rows), rng.standard_normal(rows)
    kind = np.array(["red", "green", "blue"])[rng.integers(0, 3, rows)]
    return pa.table({"a": a, "b": b, "kind": kind, "label": np.where(a + b > 0, "yes", "no")})


WRITE = {
    "parquet": lambda t, p: pq.write_table(t, p, row_group_size=250),
    "feather": lambda t, p: feather.write_feather(t, p, chunksize=250, compression="uncompressed"),
    "arrow": lambda t, p: _write_stream(t, p),
}


def _write_stream(table: "pa.Table", path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=250)


def test_the_check_sees_a_memory_map(tmp_path):
    """The check itself: a file pyarrow maps is found in /proc/self/maps (so its absence means something)."""
    path = tmp_path / "t.parquet"
    WRITE["parquet"](_table(), path)
    source = pa.memory_map(str(path), "r")
    assert mapped(path)
    source.close()


@pytest.mark.parametrize("kind", sorted(WRITE))
def test_columnar_chunks_read_without_a_map(tmp_path, kind):
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data.columnar import columnar_chunks
    from magmadnn_cli.data.readers import ReadSpec
    path = tmp_path / f"t.{kind}"
    WRITE[kind](_table(), path)
    spec = ReadSpec.of(DataConfig(train=path, target="label"))
    chunks = columnar_chunks(path, spec, 300)
    first = next(chunks)
    assert 0 < len(first.x) < ROWS and not mapped(path), mapped(path)  # open, after its first batch
    rest = list(chunks)
    assert len(first.x) + sum(len(t.x) for t in rest) == ROWS
    np.testing.assert_array_equal(np.concatenate([first.x[:, 0]] + [t.x[:, 0] for t in rest]),
                                  _table().column("a").to_numpy().astype(first.x.dtype))


def test_streamed_blocks_read_without_a_map(tmp_path):
    """The streamed fitting passes and epochs read a Parquet file's row groups unmapped too."""
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data import stream
    from magmadnn_cli.data.table import ReadSpec
    path = tmp_path / "t.parquet"
    WRITE["parquet"](_table(), path)
    file = stream.BlockFile.of(path, ReadSpec.of(DataConfig(train=path, target="label")))
    read, blocks = file.reader(), file.blocks()
    assert len(read(blocks[0], 0).raw.x) == 250 and len(blocks) == 8
    assert not mapped(path), mapped(path)


def test_predict_streams_a_parquet_file_without_a_map(tmp_path, capsys, monkeypatch):
    from magmadnn_cli.commands.predict import predict
    from magmadnn_cli.inference import Predictor
    path = tmp_path / "t.parquet"
    WRITE["parquet"](_table(), path)
    (tmp_path / "c.yaml").write_text(
        f"name: unmapped\nseed: 0\ndata: {{train: {path}, target: label}}\n"
        "model: {layers: [{type: dense, units: 2, activation: softmax}]}\nloss: cross_entropy\n"
        "optimizer: {type: adam, learning_rate: 0.01}\n"
        "training: {epochs: 1, batch_size: 64, checkpoint: false}\n")
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 0, out + err
    seen, real = [], Predictor.predict_table

    def predict_table(self, table, *args, **kwargs):
        seen.append(mapped(path))  # the reader is open: this chunk read, the next not yet
        return real(self, table, *args, **kwargs)
    monkeypatch.setattr(Predictor, "predict_table", predict_table)
    assert predict(tmp_path / "run", path, tmp_path / "p.csv", chunk_rows=300) == ROWS
    assert len(seen) == 7 and not any(seen), seen  # 2000 rows in chunks of 300
