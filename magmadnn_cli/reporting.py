"""Progress and results, reported through one place: a live rich progress bar on a terminal, one
plain line per epoch otherwise (log files get no control characters), or with --quiet only where the
results were written."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult, RenderHook
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

_BIDI = {0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}  # direction overrides ("Trojan source")
_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")
            for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), *_BIDI) if chr(c) not in "\n\t"}


def visible(text: str) -> str:
    """User text (paths, column names, labels, keys) as it may reach a terminal or a log: control
    characters and direction overrides shown escaped (`\\x1b`), so a name cannot move the cursor,
    clear or retitle the terminal, or reorder what is shown; newlines and tabs kept."""
    return text.translate(_ESCAPES)


class _Visible:
    """A renderable whose text segments are shown through `visible` (rich's own control segments,
    the progress bar's cursor movement, pass untouched)."""

    def __init__(self, inner: RenderableType) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.inner, options):
            yield segment if segment.control else Segment(visible(segment.text), segment.style)


class _ShowVisible(RenderHook):
    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Visible(r) for r in renderables]


class SafeConsole(Console):
    """Every console of the tool: whatever it prints (messages, tables, the resolved YAML) goes
    through `visible` at the last step, so no user string reaches the terminal raw."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.push_render_hook(_ShowVisible())


def _fmt(metrics: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


class QuietOnClosedPipe(SafeConsole):
    """A console whose reader may go away (`| head`): it then prints nothing more, and the work goes on
    (rich's default is to exit)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence_stdout()


class Reporter:
    """Silent base: the interface the trainer calls."""

    def __init__(self, console: Console | None = None, warnings: bool = True) -> None:
        self.console = console or QuietOnClosedPipe(stderr=False, soft_wrap=True)
        self.warnings = warnings  # shown even with --quiet (on rank 0 only)

    def start(self, epochs: int) -> None: ...
    def step(self, epoch: int, step: int, steps: int, loss: float, accuracy: float | None) -> None: ...
    def optimizer_step(self, global_step: int, loss: float) -> None: ...  # update `global_step` done; its batch's loss
    def epoch(self, epoch: int, metrics: dict[str, Any]) -> None: ...
    def stop(self) -> None: ...

    def info(self, text: str) -> None: ...

    def done(self, text: str) -> None:
        """Where the results went: said even with --quiet (rank 0 only), one plain line."""
        if self.warnings:
            self._print(text, markup=False, highlight=False)

    def _print(self, *objects: Any, **options: Any) -> None:
        """Print to the console; once its reader has gone (`| head`), go on silently."""
        try:
            self.console.print(*objects, **options)
            self.console.file.flush()
        except BrokenPipeError:
            silence_stdout()

    def warn(self, text: str) -> None:
        if self.warnings:
            SafeConsole(stderr=True, soft_wrap=True, highlight=False).print(Text("warning: ", style="yellow") + Text(text))

    def table(self, table: Table) -> None: ...


class PlainReporter(Reporter):
    """One line per epoch: for logs and pipes (no colours, no cursor movement)."""

    def __init__(self) -> None:
        super().__init__(QuietOnClosedPipe(force_terminal=False, no_color=True, highlight=False, width=120,
                                           soft_wrap=True))

    def epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        self._print(f"epoch {epoch} {_fmt(metrics)}", markup=False)

    def info(self, text: str) -> None:
        self._print(text, markup=False)  # user text (paths, names) is never markup

    def table(self, table: Table) -> None:
        self._print(table)


class RichReporter(Reporter):
    """A live progress bar of the epoch in progress (steps, running loss and accuracy, elapsed time
    and time left in the epoch), and one line per finished epoch."""

    def __init__(self, console: Console | None = None) -> None:
        super().__init__(console)
        self.progress: Progress | None = None
        self.task: Any = None
        self.epochs = 0

    def start(self, epochs: int) -> None:
        self.epochs = epochs
        self.progress = Progress(TextColumn("[bold]epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TextColumn("left"),
                                 TimeRemainingColumn(), console=self.console, transient=True)
        self.progress.start()
        self.task = None

    def step(self, epoch: int, step: int, steps: int, loss: float, accuracy: float | None) -> None:
        """Step `step` of the epoch's `steps` is done."""
        if self.progress is None:
            return
        if self.task is None:  # the epoch's bar starts (at `step`, when resumed mid-epoch)
            self.task = self.progress.add_task("train", total=steps, completed=step - 1,
                                               epoch=f"{epoch}/{self.epochs}", stats="")
        stats = f"loss {loss:.4f}" + (f" acc {accuracy:.3f}" if accuracy is not None else "")
        self.progress.update(self.task, completed=step, stats=stats)

    def epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        if self.progress is not None:
            if self.task is not None:
                self.progress.remove_task(self.task)
                self.task = None
            self._print(f"epoch {epoch} {_fmt(metrics)}", highlight=False, markup=False)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def info(self, text: str) -> None:
        self._print(text, highlight=False, markup=False)

    def table(self, table: Table) -> None:
        self._print(table)


def silence_stdout() -> None:
    """The reader of stdout went away: point stdout at /dev/null so that nothing more (not even the
    interpreter's final flush) fails, and let the work finish."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def make_reporter(quiet: bool = False, rank: int = 0, live: bool | None = None) -> Reporter:
    """`live`: a live progress display (None: when stdout is a terminal)."""
    if quiet or rank != 0:
        return Reporter(warnings=rank == 0)
    return RichReporter() if (sys.stdout.isatty() if live is None else live) else PlainReporter()


METRICS = ("loss", "accuracy", "subset_accuracy", "micro_f1", "macro_f1", "mcc", "mse", "rmse", "mae", "r2")  # the tables' order
IN_FILES_ONLY = {"hamming_loss", "micro_precision", "micro_recall", "macro_precision", "macro_recall"}  # metrics.json has them


def shown(value: float, whole: bool | None = None) -> str:
    """A metric for a table: 4 decimals; whole and grouped from 10,000 on (a house price's MSE), or
    when `whole` (a column of such values, none below 1: one style down the column); 4 significant digits
    below 0.001 (a loss in standard units), not 0.0000."""
    if whole if whole is not None else abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.3e}" if 0 < abs(value) < 1e-3 else f"{value:.4f}"


def metrics_table(title: str, rows: dict[str, dict[str, Any]], caption: str | None = None) -> Table:
    """A table with one row per split (train / validation / test) and one column per metric, each
    column in one number style."""
    columns = sorted({k for values in rows.values() for k, v in values.items()
                      if isinstance(v, (int, float)) and k not in IN_FILES_ONLY},
                     key=lambda k: METRICS.index(k) if k in METRICS else 99)
    cells = {c: [abs(values[c]) for values in rows.values() if c in values] for c in columns}
    whole = {c: max(v) >= 1e4 and min(v) >= 1 for c, v in cells.items()}  # else each cell in its own style
    table = Table(title=Text(title), caption=Text(caption) if caption else None)
    table.add_column("split")
    for c in columns:
        table.add_column(c, justify="right")
    for split, values in rows.items():
        table.add_row(split, *(shown(values[c], whole[c]) if c in values else "" for c in columns))
    return table


def grid(title: str, columns: list[str], rows: list[list[str]], left: int = 1, caption: str | None = None) -> Table:
    """A table of strings: the first `left` columns left-aligned, the others right-aligned."""
    table = Table(title=Text(title), caption=Text(caption) if caption else None)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < left else "right")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # cells hold user text (names, labels): never markup
    return table


def bench_table(records: list[dict[str, Any]]) -> Table:
    """`magmadnn bench`'s records: seconds per depth, against PyTorch and the GEMM floor."""
    first = records[0]
    title = (f"MagmaDNN paper MLP: {first['samples']:,} rows x {first['epochs']} epochs, batch {first['batch']}, "
             f"device {first['device']}, {first.get('precision', 'float32')}")

    def secs(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows = [[str(r["layers"]), secs(r["seconds"]), secs(r["torch_seconds"]),
             "-" if r["torch_seconds"] is None else f"{r['seconds'] / r['torch_seconds']:.2f}",
             secs(r["floor_seconds"]), f"{r['seconds'] / r['floor_seconds']:.2f}", secs(r["delta_per_layer_s"])]
            for r in records]
    return grid(title, ["L", "ours s", "PyTorch s", "ours/PyTorch", "GEMM floor s", "ours/floor", "delta/layer s"],
                rows)


def env_table(facts: dict[str, Any]) -> Table:
    """`magmadnn env`'s facts, one a row (/dev/shm's free bytes in GiB)."""
    table = Table(title="magmadnn env")
    table.add_column("fact")
    table.add_column("value", overflow="fold")
    for key, value in facts.items():
        table.add_row(key.replace("_", " "), Text(_fact_text(key, value)))
    return table


def _fact_text(key: str, value: Any) -> str:
    """A fact as a person reads it: GiB for /dev/shm, yes/no, none, `a=b` pairs."""
    if key == "dev_shm_free" and isinstance(value, int):
        return f"{value / 2**30:.1f} GiB"
    if key == "launched_ranks" and value == 0:  # this process was started alone (launched_by says how)
        return "none"
    if key == "blas_threads" and not value:
        return "the library's default (no thread variable set)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def evaluation_tables(report: dict[str, Any]) -> list[RenderableType]:
    """`magmadnn evaluate`'s report as a person reads it: the data's line, the metrics, and per class
    (with many classes: the 20 of lowest recall and the most confused pairs; else the confusion matrix)."""
    parts: list[RenderableType] = [Text(str(report["data"]), style="bold")
                                   + Text(f": {report['rows']} rows, task {report['task']}")]
    table = Table(title="metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in METRICS:
        if key in report:
            table.add_row(key, shown(report[key]))
    parts.append(table)
    if "per_class" in report:
        summary = report.get("confusion_summary")
        parts.append(_per_class_table(report["per_class"], bool(summary)))
        parts.append(_confused_pairs(summary) if summary else _confusion_matrix(report["labels"], report["confusion_matrix"]))
    return parts


def _per_class_table(classes: dict[str, dict[str, Any]], summarized: bool) -> Table:
    shown = sorted(classes, key=lambda c: (classes[c]["support"] == 0, classes[c]["recall"]))[:20] if summarized \
        else list(classes)
    per = Table(title=f"per class: the {len(shown)} of {len(classes):,} classes with the lowest recall (--json "
                "lists all)" if summarized else "per class")
    for c in ("class", "precision", "recall", "f1", "support"):
        per.add_column(c, justify="right" if c != "class" else "left")
    for label in shown:
        m = classes[label]
        per.add_row(Text(str(label)), f"{m['precision']:.3f}", f"{m['recall']:.3f}", f"{m['f1']:.3f}", str(m["support"]))
    return per


def _confused_pairs(summary: dict[str, Any]) -> Table:
    pairs = Table(title=f"most confused classes ({summary['wrong']:,} rows wrong in all)")
    for c in ("true", "predicted", "rows"):
        pairs.add_column(c, justify="right" if c == "rows" else "left")
    for pair in summary["most_confused"]:
        pairs.add_row(Text(pair["true"]), Text(pair["predicted"]), str(pair["count"]))
    return pairs


def _confusion_matrix(labels: list[Any], matrix: list[list[int]]) -> Table:
    cm = Table(title="confusion matrix (rows: true, columns: predicted)")
    cm.add_column("")
    for label in labels:
        cm.add_column(Text(str(label)), justify="right")
    for label, row in zip(labels, matrix):
        cm.add_row(Text(str(label)), *map(str, row))
    return cm
