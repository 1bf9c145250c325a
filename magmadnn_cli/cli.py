"""The `magmadnn` command line: parse options, call one function, turn known errors into one
readable message (exit 2). `--debug` shows the traceback."""

from __future__ import annotations

import contextlib
import inspect
import json
import signal
import sys
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
import yaml
from pydantic import ValidationError
from rich.syntax import Syntax
from rich.text import Text

from . import signals
from .errors import DataError, Interrupted, MagmaError
from .commands.launch.ranks import load_checked
from .reporting import QuietOnClosedPipe, SafeConsole

app = typer.Typer(no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  help="magmadnn: train, evaluate, tune and run neural networks declared in YAML.",
                  context_settings={"help_option_names": ["-h", "--help"]})
out = QuietOnClosedPipe(soft_wrap=True)
err = SafeConsole(stderr=True, soft_wrap=True)
RANKED = ("train", "tune", "lr-find")  # the commands that use every rank of a launch (the others run on rank 0)

ConfigArg = Annotated[Path, typer.Argument(help="YAML config file", show_default=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="override: dotted.key=value (repeatable)",
                                                     metavar="KEY=VALUE", show_default=False)]

SeedOpt = Annotated[Optional[int], typer.Option("--seed", min=0, max=2**31 - 1, metavar="N", show_default=False,
                                                help="the run's seed (as --set seed=N) [default: the config's]")]


def _seeded(overrides: list[str] | None, seed: int | None) -> list[str]:
    """The --set overrides, with --seed as the last (it wins over a --set seed=...)."""
    return [*(overrides or []), *([f"seed={seed}"] if seed is not None else [])]


def _version(value: bool) -> None:
    if value:
        from . import __version__
        print(f"magmadnn {__version__}")
        raise typer.Exit()


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", metavar="", help="show Python tracebacks for errors "
                                              "(also after the command)")] = False,
          version: Annotated[bool, typer.Option("--version", metavar="", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """The global options (`--debug` is read by `main` before the command runs, wherever it is given)."""


QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="no progress, per-trial lines or tables")]
OverwriteFileOpt = Annotated[bool, typer.Option("--overwrite", metavar="", help="replace an existing --output file")]
OversubscribeOpt = Annotated[bool, typer.Option("--oversubscribe", metavar="", help="allow --processes above the "
                                                "slots of the hosts, the Slurm allocation's tasks, or 4 per core")]
ProcessesOpt = Annotated[Optional[str], typer.Option("--processes", "-n", metavar="N|auto", show_default=False,
                         help="ranks, under mpiexec; auto: every slot of the hosts, the Slurm allocation, or the cores "
                         "here [default: distributed.processes]")]
DeviceOpt = Annotated[str, typer.Option(help="auto | cpu | gpu")]
ModelArg = Annotated[Path, typer.Argument(help="model.npz from `magmadnn train`, or its run folder")]
HostfileOpt = Annotated[Optional[Path], typer.Option("--hostfile", help="`host:slots` or `host slots=N` a line", show_default=False)]
HostsOpt = Annotated[Optional[str], typer.Option("--hosts", metavar="H:SLOTS,...", help="as node01:4,node02:4")]


def _reporter(quiet: bool, comm):
    """Rank 0's progress: live on a person's terminal, else a line per epoch (the other ranks: none)."""
    from .distributed.launcher import output_is_terminal
    from .reporting import make_reporter
    return make_reporter(quiet, comm.rank, output_is_terminal(comm.size))


def _config_on_ranks(config: Path, overrides: list[str] | None, layout: tuple, strategy: bool = True):
    """The config and this rank's communicator, or the launched job's exit (`commands/launch/ranks.py`)."""
    from .commands.launch.ranks import config_on_ranks
    cfg, comm, code = config_on_ranks(config, overrides, layout, strategy)
    if code is not None:
        raise typer.Exit(code)
    return cfg, comm


@app.command()
def train(config: ConfigArg, set_: SetOpt = None, seed: SeedOpt = None,
          out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="run directory [default: runs/<name>]")] = None,
          init_from: Annotated[Optional[Path], typer.Option(
              "--init-from", help="start from these weights: a model file, a checkpoint, or a run folder")] = None,
          resume: Annotated[Optional[Path], typer.Option("--resume", "-r", help="continue exactly from a checkpoint, "
                            "or the newest one of a run directory", show_default=False)] = None,
          quiet: QuietOpt = False,
          overwrite: Annotated[bool, typer.Option("--overwrite", metavar="", help="replace the earlier run in --out "
                               "(without it, a re-run writes runs/<name>-2, ... and an --out holding a run is refused)")] = False,
          processes: ProcessesOpt = None, hostfile: HostfileOpt = None, hosts: HostsOpt = None,
          oversubscribe: OversubscribeOpt = False,
          folds: Annotated[Optional[int], typer.Option("--folds", "-k", min=2, max=100, metavar="K", help="K-fold cross-validation "
                           "(stratified by class; shuffled for regression): mean and std of every metric over the "
                           "held-out folds; writes no model",
                           show_default=False)] = None) -> None:
    """Train the model a config declares; writes model.npz, metrics.json, metrics.csv, config.yaml and
    checkpoints (resume with --resume RUN_DIR)."""
    from .commands.train import train as run_train
    if folds is not None and (resume is not None or init_from is not None):
        raise MagmaError("--folds runs a cross-validation from scratch; it takes neither --resume nor --init-from")
    cfg, comm = _config_on_ranks(config, _seeded(set_, seed), (processes, hostfile, hosts, oversubscribe))
    if folds is not None:
        from .commands.crossval import train_folds
        train_folds(cfg, folds, out_dir, _reporter(quiet, comm), comm, overwrite)
        return
    run_train(cfg, out_dir, init_from, _reporter(quiet, comm), comm, resume=resume, overwrite=overwrite)


@app.command()
def tune(config: ConfigArg, set_: SetOpt = None, seed: SeedOpt = None,
         out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="search directory [default: runs/<name>-tune]")] = None,
         resume: Annotated[bool, typer.Option("--resume", metavar="", help="run only the trials the search's "
                           "trials.jsonl lacks (without --out: the newest runs/<name>-tune*)")] = False,
         overwrite: Annotated[bool, typer.Option("--overwrite", metavar="", help="replace the earlier search in --out "
                              "(without it, a re-run writes runs/<name>-tune-2, ... and an --out holding a search is "
                              "refused)")] = False,
         quiet: QuietOpt = False,
         processes: ProcessesOpt = None, hostfile: HostfileOpt = None, hosts: HostsOpt = None,
         oversubscribe: OversubscribeOpt = False) -> None:
    """Grid or random hyperparameter search over the config's `search:` section (under --processes:
    rank 0 hands out trials, the others train them)."""
    from .commands.tune import tune as run_tune
    cfg, comm = _config_on_ranks(config, _seeded(set_, seed), (processes, hostfile, hosts, oversubscribe),
                                 strategy=False)
    run_tune(cfg, out_dir, _reporter(quiet, comm), comm, resume, overwrite)


StrictOpt = Annotated[bool, typer.Option("--strict", metavar="", help="refuse categories the model did not see in "
                                         "training and missing cells (default: all-zero one-hot, and the "
                                         "training fill, counted in a warning)")]


def _warn(message: str) -> None:
    err.print(f"warning: {message}", markup=False, highlight=False)


@app.command()
def evaluate(model: ModelArg,
             data: Annotated[Optional[Path], typer.Argument(help="CSV (with the target column), NPZ (x, y) or "
                                                            "images; or none, with --split", show_default=False)] = None,
             split: Annotated[Optional[str], typer.Option("--split", help="score the run's own held-out split: test, "
                                                          "validation or train (rebuilt from its config and seed)",
                                                          show_default=False)] = None,
             as_json: Annotated[bool, typer.Option("--json", metavar="", help="print the metrics as JSON")] = False,
             strict: StrictOpt = False,
             device: DeviceOpt = "auto") -> None:
    """Loss, accuracy, per-class precision/recall/F1, macro F1, MCC, confusion matrix (or MSE/RMSE/MAE/R2)."""
    from .commands.evaluate import evaluate_model
    report = evaluate_model(model, data, device, split, strict, _warn)
    if as_json:
        from .files import to_json
        print(to_json(report))
        return
    from .reporting import evaluation_tables
    for part in evaluation_tables(report):
        out.print(part)


@app.command()
def predict(model: ModelArg,
            data: Annotated[Path, typer.Argument(help="CSV, Parquet, Feather or JSON Lines with the model's feature "
                                                 "columns (others are ignored), NPZ (x) or images; - for CSV on stdin")],
            output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file to write: .parquet, .feather, "
                              ".jsonl or CSV (any other name; - or none: stdout); never a link, device or an input")] = None,
            overwrite: OverwriteFileOpt = False,
            proba: Annotated[bool, typer.Option("--proba", metavar="", help="add a prob_<label> column per class")] = False,
            keep: Annotated[Optional[list[str]], typer.Option("--keep", "-k", help="copy this input column (e.g. an "
                            "ID) to the output, before the predictions (repeatable)", show_default=False)] = None,
            strict: StrictOpt = False,
            device: DeviceOpt = "auto") -> None:
    """Predictions from a saved model, one row per input row, in order (streams large files)."""
    from .commands.predict import predict as run_predict, written
    from .reporting import silence_stdout
    try:
        rows = run_predict(model, data, output, proba, device, keep=tuple(keep or ()), strict=strict, warn=_warn,
                           overwrite=overwrite)
    except BrokenPipeError:  # stdout's reader went away (`| head`): stop quietly, as `cat` does
        silence_stdout()
        raise typer.Exit(141) from None
    if output is not None and str(output) != "-":
        err.print(written(rows, output), markup=False, highlight=False)


@app.command()
def export(model: ModelArg,
           output: Annotated[Optional[Path], typer.Option("--output", "-o", help="the .onnx file to write [default: "
                                                          "model.onnx beside the model file]", show_default=False)] = None,
           overwrite: OverwriteFileOpt = False,
           opset: Annotated[Optional[int], typer.Option("--opset", help="ONNX opset (default: the lowest the model "
                                                        "needs: 17, or 20 when it reads text columns)")] = None) -> None:
    """The model's whole inference path (its preprocessing included) as one ONNX graph: raw rows in,
    what `predict --proba` prints out (onnxruntime runs it)."""
    from .commands.export import export as run_export, written
    err.print(written(run_export(model, output, overwrite, opset)), markup=False, highlight=False)


@app.command()
def serve(model: ModelArg,
          host: Annotated[str, typer.Option(help="address to listen on (another than 127.0.0.1 is reachable from "
                                            "other machines)")] = "127.0.0.1",
          port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: a free one)")] = 8080,
          max_batch_rows: Annotated[int, typer.Option(help="rows the model's thread takes at once")] = 1024,
          max_wait_ms: Annotated[float, typer.Option(help="the longest a batch waits for requests whose bodies are still arriving (a lone request waits for none)")] = 5.0,
          max_body_mb: Annotated[float, typer.Option(help="larger request bodies are refused (413)")] = 16.0,
          timeout_s: Annotated[float, typer.Option(help="a request not answered in time gets 504")] = 30.0,
          token_file: Annotated[Optional[Path], typer.Option(help="every endpoint but /health needs "
                                "Authorization: Bearer <the file's token>", show_default=False)] = None,
          device: DeviceOpt = "auto") -> None:
    """A saved model behind HTTP: POST /predict and /invocations (MLflow's protocol); GET /health,
    /ready, /metadata and /metrics. Needs the serve extra: pip install 'magmadnn-cli[serve]'."""
    from .commands.serve import serve as run_serve
    run_serve(model, host, port, max_batch_rows, max_wait_ms, max_body_mb, timeout_s, token_file, device,
              say=lambda message: err.print(message, markup=False, highlight=False), warn=_warn)


@app.command("lr-find")
def lr_find(config: ConfigArg, set_: SetOpt = None,
            low: Annotated[float, typer.Option("--min", help="the first learning rate")] = 1e-7,
            high: Annotated[float, typer.Option("--max", help="the last learning rate")] = 10.0,
            steps: Annotated[int, typer.Option("--steps", min=2, help="rates (one training step each)")] = 100,
            output: Annotated[Optional[Path], typer.Option("--output", "-o", help="the loss curve as .png (or .pdf, "
                                                           ".svg)")] = None,
            overwrite: OverwriteFileOpt = False,
            as_json: Annotated[bool, typer.Option("--json", metavar="", help="print the curve and suggestion as JSON")] = False,
            processes: ProcessesOpt = None, hostfile: HostfileOpt = None, hosts: HostsOpt = None,
            oversubscribe: OversubscribeOpt = False) -> None:
    """Which learning rate? The range test: one step per rate, rates growing exponentially from --min
    to --max, on the config's model and data (nothing of a run is written); suggests the rate where the
    smoothed loss falls fastest, with the command that trains with it."""
    from .commands.lr_find import check_arguments, lr_find as run_lr_find, plot as plot_curve, said, train_command
    from .files import to_json
    from .reporting import make_reporter
    check_arguments(load_checked(config, set_, draw_seed=False), config, low, high, steps, output, overwrite)  # before ranks
    cfg, comm = _config_on_ranks(config, set_, (processes, hostfile, hosts, oversubscribe))
    result = run_lr_find(cfg, comm, low, high, steps, make_reporter(True, comm.rank))
    if not comm.is_root:
        return
    if output is not None:
        plot_curve(result, output, overwrite)
    command = train_command(config, result["suggested_learning_rate"])
    if as_json:
        print(to_json({**result, "train_command": command}))
        return
    err.print(said(result, low, command), markup=False, highlight=False)
    if output is not None:
        err.print(f"wrote {output}", markup=False, highlight=False)


@app.command("env")
def environment(as_json: Annotated[bool, typer.Option("--json", metavar="", help="print the facts as JSON")] = False) -> None:
    """What this machine offers a run: MPI library and launcher, ranks `--processes auto` would start
    (the cores, or the Slurm allocation's tasks), cores, BLAS and its threads, GPUs and NCCL, /dev/shm."""
    from .distributed.environment import describe, launch_leftovers
    from .files import to_json
    if (leftover := launch_leftovers()) is not None:
        _warn(leftover)
    facts = describe()
    if as_json:
        print(to_json(facts))
        return
    from .reporting import env_table
    out.print(env_table(facts))


@app.command()
def validate(config: ConfigArg, set_: SetOpt = None) -> None:
    """Check a config as `train` does before its first step (data, shapes, output width, memory);
    print it resolved, with every default and the seed."""
    from .commands.train import validate_run
    from .distributed.launcher import check_processes, processes_origin
    cfg = load_checked(config, set_)
    check_processes(cfg.distributed.processes, False, processes_origin(cfg, config))  # as train checks it
    notes = validate_run(cfg)
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    out.print(Syntax(text, "yaml", theme="ansi_dark", background_color="default") if out.is_terminal else Text(text),
              end="")
    for note in notes:  # what train would say of the data
        err.print(note, markup=False, highlight=False)
    err.print(f"{config}: valid", markup=False, highlight=False)


@app.command()
def plot(folder: Annotated[Path, typer.Argument(help="a run folder (learning curves) or a search folder "
                                                "(objective by hyperparameter) or a cross-validation folder "
                                                "(metrics per fold)")],
         output: Annotated[Optional[Path], typer.Option("--output", "-o", help="the plot as .png, .pdf or .svg, "
                           "by its suffix [default: FOLDER/curves.png, objective.png or folds.png]")] = None,
         overwrite: OverwriteFileOpt = False) -> None:
    """Plot a run's loss and metrics per epoch (train vs validation, best epoch marked), a search's
    objective against each hyperparameter, or a cross-validation's metrics per fold (with their mean).
    Needs matplotlib (the `plot` extra)."""
    from .commands.plot import plot as run_plot
    written = run_plot(folder, output, overwrite)
    err.print(f"wrote {written}", markup=False, highlight=False)


@app.command()
def bench(layers: Annotated[str, typer.Option(help="hidden-layer counts L to time, comma-separated")] = "1,2,3,4",
          samples: Annotated[int, typer.Option(min=1, help="MNIST-shaped training rows")] = 60000,
          epochs: Annotated[int, typer.Option(min=1, help="epochs per depth")] = 5,
          device: DeviceOpt = "auto",
          precision: Annotated[str, typer.Option(help="float32 | float64 | mixed_bfloat16 | mixed_float16")] = "float32",
          as_json: Annotated[bool, typer.Option("--json", metavar="", help="print a JSON list of per-depth records")] = False) -> None:
    """The MagmaDNN paper's benchmark: 784 -> L x 528 sigmoid -> 10, batch 100, SGD, whole epochs;
    ours beside the GEMM-only floor and PyTorch eager (when installed) on the same device."""
    from .commands.bench import bench as run_bench, depths_of
    from .reporting import bench_table
    depths = depths_of(layers)
    say = None if as_json else (lambda r: err.print(f"L={r['layers']}: {r['seconds']:.3f} s", markup=False, highlight=False))
    records = run_bench(depths, samples, epochs, device, say, precision)
    if as_json:
        from .files import to_json
        print(to_json(records))
        return
    out.print(bench_table(records))


@app.command()
def schema() -> None:
    """The JSON Schema of the config file (for editor completion and checks)."""
    from .config.json_schema import json_schema
    print(json.dumps(json_schema(), indent=2))


@app.command()
def summary(source: Annotated[Path, typer.Argument(help="YAML config file, or model.npz or its run folder",
                                                    show_default=False)], set_: SetOpt = None) -> None:
    """Layers, output shapes, parameter counts and FLOPs per sample, of a config or a saved model."""
    from .commands.summary import is_saved_model, summarize, summarize_saved
    table, problem = summarize_saved(source, set_) if is_saved_model(source) else summarize(load_checked(source, set_))
    out.print(table)
    if problem:  # the table helps to fix it; train and validate refuse the config
        raise DataError(problem)


for _command in app.registered_commands:  # the command list: a docstring's first paragraph, re-wrapped
    _command.short_help = " ".join(inspect.cleandoc(_command.callback.__doc__ or "").split("\n\n")[0].split())


def main() -> None:
    from .distributed.launcher import before_numpy
    before_numpy()
    debug = "--debug" in sys.argv[1:]  # a global option, before or after the command
    sys.argv[1:] = [arg for arg in sys.argv[1:] if arg != "--debug"]
    from .distributed.environment import launch_gate
    args = sys.argv[1:]
    command = next((a for a in args if not a.startswith("-")), "")
    refused, runs_here = launch_gate(ranked=command in RANKED, exempt=command in ("env", "") or "--help" in args
                                     or "-h" in args)
    if refused is not None:
        err.print(Text("error: ", style="bold red") + Text(refused), highlight=False)
        sys.exit(2)
    if not runs_here:
        return  # under mpirun, commands that are not data-parallel run (print, write) once, on rank 0
    with signals.watching():
        try:
            app()
        except BaseException as exc:  # noqa: BLE001 (every ending maps to its exit code and message)
            _exit_for(exc, debug)


def _exit_for(exc: BaseException, debug: bool) -> NoReturn:
    """End the command as it ended: training's checkpointed stop, any ending after a stop signal
    (numpy or pyarrow may have turned its KeyboardInterrupt into another error), typer's own exit,
    a user mistake (exit 2) or a bug (exit 1, and how to see the traceback)."""
    if isinstance(exc, Interrupted):
        _fail(exc, exc.exit_code, debug, "interrupted: ")
    if signals.received() or isinstance(exc, KeyboardInterrupt):
        err.print("interrupted")
        sys.exit(128 + (signals.received() or signal.SIGINT))
    if isinstance(exc, SystemExit):
        raise exc
    if isinstance(exc, (MagmaError, ValidationError)):
        _fail(exc, getattr(exc, "exit_code", 2), debug)
    if debug:
        raise exc
    _fail(exc, 1, debug, f"internal error: {type(exc).__name__}: ",
          "\nThis is a bug in magmadnn; run again with --debug for the traceback, and report it.")


def _fail(exc: BaseException, code: int, debug: bool, prefix: str = "error: ", suffix: str = "") -> None:
    """Report on this rank (with the traceback under --debug), then end the job: under MPI every rank
    is aborted so none hangs."""
    import socket
    from .distributed.comm import abort_if_distributed, has_joined, launched_rank, launched_ranks
    if debug:
        err.print_exception()
    ranked = launched_ranks() > 1  # under a launcher, with or without a communicator yet
    together = getattr(exc, "collective", False)  # every rank raised it at the same point: no abort needed
    if launched_rank() == 0 or not together:
        rank = f"rank {launched_rank()} on {socket.gethostname()}: " if ranked and not together else ""
        err.print(Text(rank + prefix, style="bold red") + Text(str(exc) + suffix), highlight=False)
    if not together:
        if ranked and not has_joined():  # failed before joining MPI: join it to end the others (no rank hangs)
            from .distributed import get_communicator
            with contextlib.suppress(MagmaError):  # MPI itself cannot be joined: what was said is the error
                get_communicator("allreduce")
        abort_if_distributed(code)
    sys.exit(code)
