"""Image loaders on small files the tests write in the real formats: MNIST IDX (plain and gzip),
CIFAR-10 binary and python batches; corrupt files and hostile pickles are refused."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest

from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data.prepare import prepare, sample_shape_of
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError

rng = np.random.default_rng(5)


def write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_mnist_idx_pair(tmp_path, suffix):
    images = rng.integers(0, 256, size=(7, 28, 28))
    labels = rng.integers(0, 10, size=7)
    write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", images)
    write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", labels)
    t = read_table(tmp_path / f"train-images-idx3-ubyte{suffix}", ReadSpec(None, None))
    assert t.x.shape == (7, 1, 28, 28) and t.x.dtype == np.float32
    np.testing.assert_array_equal(t.x[:, 0], images)
    np.testing.assert_array_equal(t.y, labels)
    assert sample_shape_of(DataConfig(train=tmp_path / f"train-images-idx3-ubyte{suffix}"), "classification", 0) == (1, 28, 28)


def test_idx_problems(tmp_path):
    write_idx(tmp_path / "a-images-idx3-ubyte", rng.integers(0, 256, size=(2, 4, 4)))
    with pytest.raises(DataError, match="labels file a-labels-idx1-ubyte is not beside it"):
        read_table(tmp_path / "a-images-idx3-ubyte", ReadSpec(None, None))
    raw = (tmp_path / "a-images-idx3-ubyte").read_bytes()
    (tmp_path / "b-images-idx3-ubyte").write_bytes(raw[:-5])
    write_idx(tmp_path / "b-labels-idx1-ubyte", np.zeros(2))
    with pytest.raises(DataError, match="truncated or corrupt IDX file"):
        read_table(tmp_path / "b-images-idx3-ubyte", ReadSpec(None, None))
    (tmp_path / "c-images-idx3-ubyte").write_bytes(b"\x12\x34garbage")
    write_idx(tmp_path / "c-labels-idx1-ubyte", np.zeros(2))
    with pytest.raises(DataError, match="bad magic number"):
        read_table(tmp_path / "c-images-idx3-ubyte", ReadSpec(None, None))


def test_cifar_binary_batches_folder(tmp_path):
    labels, pixels = [], []
    for i in (1, 2):
        y = rng.integers(0, 10, size=3, dtype=np.uint8)
        x = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
        (tmp_path / f"data_batch_{i}.bin").write_bytes(np.c_[y, x].astype(np.uint8).tobytes())
        labels.append(y)
        pixels.append(x)
    t = read_table(tmp_path, ReadSpec(None, None))
    assert t.x.shape == (6, 3, 32, 32)
    np.testing.assert_array_equal(t.y, np.concatenate(labels))
    np.testing.assert_array_equal(t.x.reshape(6, -1), np.concatenate(pixels))
    (tmp_path / "bad.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match="not a multiple of 3073"):
        read_table(tmp_path / "bad.bin", ReadSpec(None, None))


def test_cifar_python_batches_and_hostile_pickles(tmp_path):
    x = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    batch = {b"batch_label": b"training batch 1 of 5", b"labels": [1, 2, 3, 4], b"data": x,
             b"filenames": [b"a.png"] * 4}
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=2))
    t = read_table(tmp_path / "data_batch_1", ReadSpec(None, None))
    assert t.x.shape == (4, 3, 32, 32) and list(t.y) == [1, 2, 3, 4]
    np.testing.assert_array_equal(t.x.reshape(4, -1), x)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "data_batch_1").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError, match="refused to load builtins.print"):
        read_table(tmp_path / "evil" / "data_batch_1", ReadSpec(None, None))


def test_images_flow_through_prepare(tmp_path):
    write_idx(tmp_path / "t-images-idx3-ubyte", rng.integers(0, 256, size=(20, 6, 6)))
    write_idx(tmp_path / "t-labels-idx1-ubyte", np.arange(20) % 2)
    p = prepare(DataConfig(train=tmp_path / "t-images-idx3-ubyte", validation_split=0.25, scale=1 / 255), "classification", 0)
    assert p.train.x.shape == (15, 1, 6, 6) and p.sample_shape == (1, 6, 6)
    assert 0.0 <= p.train.x.min() and p.train.x.max() <= 1.0
