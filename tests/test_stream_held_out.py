"""Held-out rows read on several ranks (issue 48): evaluation gives each rank a contiguous share of
the split's rows (training/evaluation.py), and a streamed split starts reading at the block that
holds its share's first row, so the ranks' block reads are spread over them (no rank reads the
blocks before its share), and the rows are one process's."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data import stream, stream_prepare
from magmadnn_cli.data.stream_prepare import InOrder, StreamSource, prepare_streamed
from magmadnn_cli.training.evaluation import inference_batches
from test_stream_train import _write


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(stream, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(stream_prepare, "BUFFER_ROWS", 128)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", ["validation", "test"])
def test_each_rank_reads_the_blocks_of_its_share_only(tmp_path, monkeypatch, small_blocks, ranks, name):
    data = prepare_streamed(DataConfig(train=_write(tmp_path, "csv"), target="label", validation_split=0.2,
                                       test_split=0.2), "classification", 7)
    split = getattr(data, name)
    source, code, rows = split.x.source, split.x.code, len(split.x)
    whole = InOrder(source, code, rows, split.x.shape[1], split.x.dtype)[0:rows]
    read: list[int] = []
    encoded = StreamSource._encoded
    monkeypatch.setattr(StreamSource, "_encoded",
                        lambda self, r, block, c: read.append(block.first_row) or encoded(self, r, block, c))
    got, reads = [], []
    for rank in range(ranks):  # as evaluate_split shards the rows: a fresh process's view on each rank
        read.clear()
        x = InOrder(source, code, rows, split.x.shape[1], split.x.dtype)
        got += [x[part] for part in inference_batches(None, rows * rank // ranks, rows * (rank + 1) // ranks, 37)]
        source.close()
        reads.append(set(read))
    np.testing.assert_array_equal(np.concatenate(got), whole)  # one process's rows, in order
    blocks = len(source.blocks)
    holding = {b.first_row for b in source.blocks if np.any(source.codes(b) == code)}
    assert holding <= set().union(*reads)  # every block with rows of the split, read by some rank
    for mine in reads:  # its share's blocks, the one it shares with a neighbour, and one read ahead
        assert len(mine) <= blocks // ranks + 3, (len(mine), blocks)
