"""Memory bounded by design (issue 26): one budget (the machine's free memory, the address-space
limit, the cgroup's limit) checked before allocating, by the network, the readers and the metrics.
Memory caps are real: the CLI runs in a subprocess under RLIMIT_AS."""

from __future__ import annotations

import gzip
import resource
import subprocess
import sys

import numpy as np
import pytest

from conftest import BLOBS_CONFIG, ROOT, blobs_csv, run_cli

GiB = 1 << 30


def capped(cap: int, *args, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """`magmadnn ARGS` in a subprocess whose address space is limited to `cap` bytes."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return subprocess.run([sys.executable, "-m", "magmadnn_cli", *map(str, args)], cwd=cwd, preexec_fn=limit,
                          capture_output=True, text=True, timeout=timeout, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                                               "COLUMNS": "200"})


def project(folder, config: str = BLOBS_CONFIG):
    blobs_csv(folder / "blobs.csv")
    (folder / "c.yaml").write_text(config)
    return folder / "c.yaml"


def clean_refusal(done: subprocess.CompletedProcess, *expected: str) -> None:
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert "Traceback" not in text and "internal error" not in text and "MemoryError" not in text, text
    for part in expected:
        assert part in " ".join(text.split()), text


# -- the budget ----------------------------------------------------------------------------------
def test_the_budget_counts_the_address_space_limit():
    code = "from magmadnn_cli.core import backend as B; print(B.host_memory_available())"
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * GiB, 2 * GiB))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, preexec_fn=limit, capture_output=True, text=True,
                          timeout=60)
    assert 0 < int(done.stdout) < 2 * GiB, done.stdout + done.stderr


def _cgroup(tmp_path, lines, files):
    tmp_path.mkdir()
    (tmp_path / "cgroup").write_text("\n".join(lines) + "\n")
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    from magmadnn_cli.core import backend as B
    return B._cgroup_headroom(tmp_path / "cgroup", tmp_path / "fs")


def test_the_budget_counts_cgroup_limits_v2_and_v1(tmp_path):
    v2 = {"fs/job/memory.max": f"{4 * GiB}\n", "fs/job/memory.current": f"{3 * GiB}\n",
          "fs/job/memory.stat": f"anon 5\ninactive_file {GiB // 2}\n",
          "fs/job/step/memory.max": "max\n", "fs/job/step/memory.current": "100\n"}
    assert _cgroup(tmp_path / "a", ["0::/job/step"], v2) == 4 * GiB - (3 * GiB - GiB // 2)  # the parent's limit binds
    v1 = {"fs/memory/memory.limit_in_bytes": f"{2 * GiB}\n", "fs/memory/memory.usage_in_bytes": f"{GiB}\n"}
    assert _cgroup(tmp_path / "b", ["4:memory:/not/visible/here", "1:cpu:/x"], v1) == GiB  # a container's own root
    unlimited = {"fs/memory/memory.limit_in_bytes": "9223372036854771712\n"}
    assert _cgroup(tmp_path / "c", ["4:memory:/"], unlimited) is None
    assert _cgroup(tmp_path / "d", ["0::/"], {"fs/memory.max": "max\n"}) is None


def test_require_memory_names_the_budget_and_what_sets_it():
    from magmadnn_cli.core import backend as B
    from magmadnn_cli.errors import MagmaError
    with pytest.raises(MagmaError, match=r"would need 1024\.0 GiB of memory; .* GiB available to this process"):
        B.require_memory(1 << 40, "a test")


# -- the network -----------------------------------------------------------------------------------
def test_a_huge_layer_is_refused_under_an_address_space_limit(tmp_path):
    """units: 100000000 passed the check on MemAvailable and died of MemoryError under a 3 GiB cap."""
    config = project(tmp_path, BLOBS_CONFIG.replace("units: 16", "units: 100000000"))
    done = capped(3 * GiB, "validate", config, cwd=tmp_path)
    clean_refusal(done, "would need", "available to this process (its address-space limit, ulimit -v)")


@pytest.mark.parametrize("units", ["4611686018427387904"])
def test_layer_sizes_beyond_int64_are_refused_not_overflowed(units, capsys, tmp_path):
    config = project(tmp_path, BLOBS_CONFIG.replace("units: 16", f"units: {units}"))
    for command in ("validate", "train"):
        code, out, err = run_cli(capsys, command, config, "--out", tmp_path / "out") if command == "train" else \
            run_cli(capsys, command, config)
        assert code == 2 and "would need" in err and "Traceback" not in out + err, out + err


def test_initialisation_temporaries_are_counted(monkeypatch):
    """Weights are drawn in float64 on the host and copied into the float32 buffer: a model whose
    buffers (weights, gradients) fit but whose float64 draw does not is refused before drawing."""
    from magmadnn_cli.config.layers import DenseLayer
    from magmadnn_cli.core import backend as B
    from magmadnn_cli.errors import MagmaError
    from magmadnn_cli.nn.layers import build_layers
    from magmadnn_cli.nn.network import Network
    params = 1000 * 1000 + 1000
    monkeypatch.setattr(B, "host_memory_available", lambda: 14 * params)  # the 12 bytes once counted fit
    with pytest.raises(MagmaError, match=r"dense_0/kernel of shape \(1000, 1000\)\), with their gradients, would "
                                         r"need 15\.3 MiB of memory \(.*drawn in float64"):
        Network(build_layers([DenseLayer(type="dense", units=1000)]), (1000,))


def test_the_training_estimate_counts_the_evaluation_batch():
    from magmadnn_cli.config.layers import DenseLayer
    from magmadnn_cli.nn.layers import build_layers
    from magmadnn_cli.nn.network import Network
    net = Network(build_layers([DenseLayer(type="dense", units=100), DenseLayer(type="dense", units=3)]), (4,))
    base = net.training_bytes(16, 2)
    assert net.training_bytes(16, 2, eval_batch=16) == base  # evaluation reuses what training freed
    assert net.training_bytes(16, 2, eval_batch=1024) == base + (1024 - 16) * 103 * 4


# -- data ----------------------------------------------------------------------------------------
def test_a_million_column_header_is_refused_before_allocating(tmp_path):
    """A one-line file: pyarrow's per-column state once died of std::bad_alloc (signal 6) under 2 GiB."""
    (tmp_path / "wide.csv").write_text(",".join(f"c{i}" for i in range(1_000_000)) + ",label\n")
    (tmp_path / "c.yaml").write_text(BLOBS_CONFIG.replace("blobs.csv", "wide.csv"))
    done = capped(2 * GiB, "validate", tmp_path / "c.yaml", cwd=tmp_path, timeout=60)
    clean_refusal(done, "wide.csv: the header has 1,000,001 columns", "available to this process")


def test_a_small_gzipped_csv_reads_under_a_3_gib_cap(tmp_path):
    """The reader once asked gzip for half of MemAvailable in one read, failing under RLIMIT_AS."""
    config = project(tmp_path, BLOBS_CONFIG.replace("blobs.csv", "blobs.csv.gz"))
    (tmp_path / "blobs.csv.gz").write_bytes(gzip.compress((tmp_path / "blobs.csv").read_bytes()))
    assert (tmp_path / "blobs.csv.gz").stat().st_size < 10_000
    done = capped(3 * GiB, "train", config, "--out", tmp_path / "out", "-q", "--set", "training.epochs=2",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _gzip_of_rows(path, header: bytes, row: bytes, inflated: int) -> None:
    """A gzip file that inflates to `inflated` bytes of `row`s: one compressed MiB of rows repeated
    as gzip members (a valid multi-member gzip), so it is written in milliseconds."""
    block = row * ((1 << 20) // len(row))
    member = gzip.compress(block, 9)
    with open(path, "wb") as f:
        f.write(gzip.compress(header))
        for _ in range(inflated // len(block)):
            f.write(member)


def test_a_gzip_of_short_rows_inflating_to_4_gib_is_refused_while_it_inflates(tmp_path):
    config = project(tmp_path, BLOBS_CONFIG.replace("blobs.csv", "bomb.csv.gz"))
    _gzip_of_rows(tmp_path / "bomb.csv.gz", b"f1,f2,f3,f4,label\n", b"1,2,3,4,a\n", 4 * GiB)
    assert (tmp_path / "bomb.csv.gz").stat().st_size < 12_000_000
    done = capped(3 * GiB, "validate", config, cwd=tmp_path, timeout=60)
    clean_refusal(done, "bomb.csv.gz: holds (or inflates to) more than", "available to this process")


def test_parsed_rows_are_counted_against_the_budget(capsys, tmp_path, monkeypatch):
    """Short rows parse into more bytes than their text: the rows read, not the text, hit the budget."""
    from magmadnn_cli.core import backend
    config = project(tmp_path)
    with open(tmp_path / "blobs.csv", "a") as f:
        f.write("1,2,3,4,a\n" * 300_000)  # 3 MB of text; 300,000 rows x 4 float32 features, plus labels
    monkeypatch.setattr(backend, "host_memory_available", lambda: 16_000_000)
    for extra in ([], ["--set", "data.columns={f1: category}"]):  # pyarrow, then the line reader (text cells)
        code, out, err = run_cli(capsys, "validate", config, *extra)
        assert code == 2 and "rows of 4 columns" in err and "Traceback" not in err, err


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_with_a_byte_order_mark_are_read(encoding, capsys, tmp_path):
    config = project(tmp_path)
    text = (tmp_path / "blobs.csv").read_text()
    bom = {"utf-16-be": "\ufeff"}.get(encoding, "")  # the -be codec writes no mark of its own
    (tmp_path / "blobs.csv").write_bytes((bom + text).encode(encoding))
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "out", "-q", "--set", "training.epochs=2")
    assert code == 0, err


def test_utf16_without_a_byte_order_mark_is_named(capsys, tmp_path):
    config = project(tmp_path)
    (tmp_path / "blobs.csv").write_bytes((tmp_path / "blobs.csv").read_text().encode("utf-16-le"))
    code, out, err = run_cli(capsys, "validate", config)
    assert code == 2 and "UTF-16" in err and "data.encoding: utf-16-le" in " ".join(err.split()), err


# -- normalization statistics --------------------------------------------------------------------
def _scaled_column(tmp_path, factor: str, precision: str, normalize: str = "standard"):
    import csv
    config = project(tmp_path, BLOBS_CONFIG.replace("device: cpu", f"device: cpu\nprecision: {precision}")
                     .replace("normalize: standard", f"normalize: {normalize}"))
    rows = list(csv.reader(open(tmp_path / "blobs.csv")))
    for row in rows[1:]:
        row[1] = repr(float(row[1]) * float(factor))
    with open(tmp_path / "blobs.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return config


@pytest.mark.parametrize("normalize", ["standard", "minmax"])
def test_statistics_that_overflow_name_the_column(normalize, capsys, tmp_path):
    """1e300 features in float64: the standard deviation (or the range) overflowed and training
    blamed the learning rate, suggesting the normalize: standard already set."""
    config = _scaled_column(tmp_path, "1e300" if normalize == "standard" else "3e307", "float64", normalize)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "out")
    text = " ".join(err.split())
    assert code == 2 and "column 'f2'" in text and "overflows float64" in text and "learning rate" not in text, err
    assert "RuntimeWarning" not in err and not (tmp_path / "out" / "model.npz").exists()


def test_float64_statistics_are_kept_in_float64(capsys, tmp_path):
    """1e39 is finite in float64 but not in float32, where the statistics were stored."""
    config = _scaled_column(tmp_path, "1e39", "float64")
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "out", "-q")
    assert code == 0, err
    with np.load(tmp_path / "out" / "model.npz") as model:
        assert model["norm/shift"].dtype == np.float64 and np.isfinite(model["norm/spread"]).all()
    code, out, err = run_cli(capsys, "predict", tmp_path / "out", tmp_path / "blobs.csv")
    assert code == 0 and "nan" not in out, err


def test_statistics_are_computed_in_float64_without_a_float64_copy(monkeypatch):
    """Column blocks: the float64 temporaries stay small whatever the table's size."""
    import tracemalloc
    from magmadnn_cli.data import normalize
    from magmadnn_cli.data.prepare import Normalizer
    x = np.random.default_rng(0).normal(5, 3, size=(200_000, 20)).astype(np.float32)
    monkeypatch.setattr(normalize, "STATS_BLOCK", 200_000)  # a column at a time
    tracemalloc.start()
    n = Normalizer.fit(x, "standard", None)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < x.nbytes / 2  # a float64 copy of x is twice its size
    np.testing.assert_allclose(n.shift, x.astype(np.float64).mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(n.spread, x.astype(np.float64).std(axis=0), rtol=1e-6)


# -- many classes --------------------------------------------------------------------------------
def _many_classes(folder, classes: int, rows: int, units: int | None = None):
    r = np.random.default_rng(0)
    labels = np.arange(rows) % classes
    x = r.normal(size=(rows, 4)) + labels[:, None] % 7
    lines = ["f1,f2,f3,f4,label"] + [",".join(f"{v:.3f}" for v in xs) + f",c{y}" for xs, y in zip(x, labels)]
    (folder / "blobs.csv").write_text("\n".join(lines) + "\n")
    config = BLOBS_CONFIG.replace("units: 3", f"units: {units or classes}").replace("epochs: 15", "epochs: 1")
    (folder / "c.yaml").write_text(config)
    return folder / "c.yaml"


def test_a_class_per_row_is_refused_with_the_rule(capsys, tmp_path):
    config = _many_classes(tmp_path, classes=300, rows=400)
    code, out, err = run_cli(capsys, "validate", config)
    text = " ".join(err.split())
    assert code == 2 and "300 classes in 400 rows" in text and "at least 2 rows per class" in text, err


def test_the_scores_of_many_classes_are_not_kept_so_need_no_budget(capsys, tmp_path, monkeypatch):
    """Issue 44: evaluation reduces each batch's scores to the rows' classes (tests/test_eval_batches.py),
    so 2 x 16 MB of scores that a 24 MB budget cannot hold are no longer asked for."""
    from magmadnn_cli.core import backend
    config = _many_classes(tmp_path, classes=1000, rows=4000)  # 4 rows per class: learnable
    monkeypatch.setattr(backend, "host_memory_available", lambda: 24_000_000)  # the network fits; 2 x 16 MB outputs not
    code, out, err = run_cli(capsys, "validate", config)
    assert code == 0, err


def test_many_classes_are_summarized_not_drawn_as_a_matrix():
    """10,000 classes: the metrics of 100,000 rows without a 10^8-cell confusion matrix."""
    import time
    import tracemalloc
    from magmadnn_cli.data.metrics import classification_report
    r = np.random.default_rng(0)
    k, n = 10_000, 100_000
    truth = r.integers(0, k, n)
    guess = np.where(r.random(n) < 0.7, truth, (truth + 1 + (truth % 3 == 0)) % k)
    tracemalloc.start()
    started = time.perf_counter()
    report = classification_report(truth, guess, [f"c{i}" for i in range(k)])
    seconds, peak = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "confusion_matrix" not in report and peak < 50_000_000 and seconds < 5, (peak, seconds)
    summary = report["confusion_summary"]
    assert summary["classes"] == k and len(summary["most_confused"]) == 20
    top = summary["most_confused"][0]
    wrong = (truth != guess)
    pairs = np.unique(truth[wrong] * k + guess[wrong], return_counts=True)
    assert top["count"] == pairs[1].max()
    assert abs(report["accuracy"] - (truth == guess).mean()) < 1e-12


def test_the_summary_agrees_with_the_dense_matrix():
    from magmadnn_cli.data import metrics
    r = np.random.default_rng(1)
    k, n = 60, 5000
    truth, guess = r.integers(0, k, n), r.integers(0, k, n)
    guess[:3000] = truth[:3000]
    labels = [f"c{i}" for i in range(k)]
    report = metrics.classification_report(truth, guess, labels)
    cm = np.zeros((k, k), np.int64)
    np.add.at(cm, (truth, guess), 1)
    assert report["mcc"] == pytest.approx(metrics.matthews(cm), abs=1e-12)
    recall = np.diag(cm) / cm.sum(axis=1)
    assert [report["per_class"][c]["recall"] for c in labels] == pytest.approx(recall.tolist())
    off = cm - np.diag(np.diag(cm))
    for pair in report["confusion_summary"]["most_confused"]:
        assert off[labels.index(pair["true"]), labels.index(pair["predicted"])] == pair["count"]
    assert report["confusion_summary"]["most_confused"][0]["count"] == off.max()
    small = metrics.classification_report(truth % 3, guess % 3, ["a", "b", "c"])
    assert np.sum(small["confusion_matrix"]) == n and "confusion_summary" not in small


def test_evaluate_prints_the_summary_of_many_classes(capsys, tmp_path):
    config = _many_classes(tmp_path, classes=60, rows=600)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")
    assert code == 0, err
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run", tmp_path / "blobs.csv")
    assert code == 0, err
    assert "most confused" in out and "lowest recall" in out and "confusion matrix" not in out
    assert len(out.splitlines()) < 80  # not a 60 x 60 matrix, nor 60 per-class rows
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run", tmp_path / "blobs.csv", "--json")
    import json
    report = json.loads(out)
    assert len(report["per_class"]) == 60 and report["confusion_summary"]["most_confused"]


def test_an_evaluation_batch_that_does_not_fit_is_refused_not_a_memory_error(capsys, tmp_path, monkeypatch):
    """Training batches of 16 fit; scoring the 96 training rows in one batch of 100,003 floats per
    row does not: a clean refusal (up front once the builder counts the evaluation batch)."""
    from magmadnn_cli.core import backend
    config = project(tmp_path, BLOBS_CONFIG.replace("units: 16", "units: 100000").replace("epochs: 15", "epochs: 1"))
    monkeypatch.setattr(backend, "host_memory_available", lambda: 35_000_000)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "out", "-q")
    text = " ".join(err.split())
    assert code == 2 and "would need" in text and "Traceback" not in text, err


def test_a_data_shape_beyond_int64_is_counted_in_python_ints(capsys, tmp_path):
    config = project(tmp_path, BLOBS_CONFIG.replace("  normalize: standard", "  normalize: standard\n"
                                                    "  shape: [4611686018427387904, 4]"))
    code, out, err = run_cli(capsys, "validate", config)
    assert code == 2 and "holds 18446744073709551616 values per sample" in err, err


def test_a_regression_target_whose_statistics_overflow_is_refused(capsys, tmp_path):
    config = _scaled_column(tmp_path, "1e300", "float64")
    text = (config.read_text().replace("units: 3, activation: softmax", "units: 1")
            .replace("target: label", "target: f2\n  features: [f1, f3, f4]").replace("cross_entropy", "mse"))
    config.write_text(text)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "out")
    assert code == 2 and "regression target's standard deviation" in err and "target_normalize: none" in err, err


def test_cpu_inference_batches_keep_a_batch_of_layer_outputs_in_cache():
    """LeNet-5's layer outputs are 8,494 floats a row: batches of 1,024 rows (35 MB) ran 6x slower a
    row than batches of 246; evaluation runs even batches within 8 MB, with the outputs of one batch,
    and a row-light MLP keeps its 1,024."""
    from magmadnn_cli.data.prepare import Split
    from magmadnn_cli.nn.layers import Conv2D, Dense, Flatten, Pool2D
    from magmadnn_cli.nn.losses import CrossEntropy
    from magmadnn_cli.nn.network import Network
    from magmadnn_cli.training import evaluation
    lenet = [Conv2D.of(filters=6, kernel_size=5, padding="same", activation="relu"), Pool2D.of(mode="max", pool_size=2),
             Conv2D.of(filters=16, kernel_size=5, activation="relu"), Pool2D.of(mode="max", pool_size=2), Flatten.of(),
             Dense.of(units=120, activation="relu"), Dense.of(units=84, activation="relu"),
             Dense.of(units=10, activation="softmax")]
    net = Network(lenet, (1, 28, 28), CrossEntropy(), seed=0)
    assert evaluation.inference_rows(net, 1024) == (8 << 20) // (net.activation_size * 4) < 1024
    assert evaluation.inference_rows(net, 100) == 100  # a smaller eval_batch_size stays
    rng = np.random.default_rng(0)
    split = Split(rng.random((600, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, (600, 1)))
    seen: list[int] = []
    run = net.loss_and_output
    net.loss_and_output = lambda x, y: seen.append(len(x)) or run(x, y)
    capped = evaluation.evaluate_split(net, split, "classification", batch_size=1024, scores=True)
    assert seen == [200, 200, 200]  # even parts of at most inference_rows: no short last batch
    np.testing.assert_allclose(capped["outputs"], net.predict(split.x), rtol=1e-5, atol=1e-7)
    mlp = Network([Dense.of(units=512), Dense.of(units=10, activation="softmax")], (784,), CrossEntropy())
    assert evaluation.inference_rows(mlp, 1024) == 1024
