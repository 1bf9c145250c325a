"""`magmadnn lr-find`: the learning-rate range test (Smith, arXiv:1506.01186; Lightning's `lr_find`) on
the config's model and data: one training step per rate, the rates growing exponentially from `low` to
`high`, the loss recorded; nothing of a run is written. The suggestion is the rate where the smoothed
loss falls fastest (the steepest descent against log(rate)), as Lightning suggests."""

from __future__ import annotations

import io
import math
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from ..config.schema import Config
from ..core import backend as B
from ..distributed import Communicator
from ..errors import EveryRankError, MagmaError
from ..files import atomic_write, check_output_file
from ..reporting import Reporter
from ..training.builder import build_run, select_backend
from ..training.convolutions import choose_convolutions
from .plot import image_format, pyplot

SMOOTHING = 0.98   # the loss's exponential moving average (bias-corrected), as fastai and Lightning
DIVERGED = 4.0     # stop once the smoothed loss exceeds this many times its best
SKIP_START = 10    # the first steps' losses are noise from the initialization: not suggested




def check_arguments(config: Config, config_path: Path, low: float, high: float, steps: int, out: Path | None,
                    overwrite: bool) -> None:
    """What the options ask, checked before any rank starts or step runs (every rank would raise the
    same: said once): rates the training precision holds, and an output that replaces nothing it
    must not (the config, the data, a file without --overwrite)."""
    dtype = np.dtype(np.float64 if config.precision == "float64" else np.float32)
    tiny, largest = float(np.finfo(dtype).tiny), float(np.finfo(dtype).max)
    for flag, rate in (("--min", low), ("--max", high)):
        if not math.isfinite(rate) or not tiny <= rate <= largest:
            raise EveryRankError(f"lr-find: {flag} {rate:g} is no learning rate a {dtype.name} model takes "
                                 f"(precision: {config.precision}): give a finite rate from {tiny:.3g} to "
                                 f"{largest:.3g}, e.g. --min 1e-7 --max 10")
    if not low < high or steps < 2:
        raise EveryRankError(f"lr-find: need --min < --max and --steps >= 2; received {low:g}, {high:g}, {steps}")
    if out is None:
        return
    data = config.data
    inputs = (config_path, *(p for p in (data.train, data.validation, data.test) if p is not None))
    try:
        check_output_file(out, tuple(Path(p) for p in inputs), overwrite=overwrite)
        image_format(out)
    except MagmaError as exc:
        raise EveryRankError(str(exc)) from None


def lr_find(config: Config, comm: Communicator, low: float, high: float, steps: int,
            reporter: Reporter | None = None) -> dict[str, Any]:
    """The range test's rates, raw and smoothed losses, and the suggested rate (None when the curve
    never descends), on every rank of `comm` (data parallel: the same steps as one process)."""
    trial = config.revised(training=config.training.revised(early_stopping=None, checkpoint=None, epochs=1),
                           optimizer=config.optimizer.revised(schedule=None))
    span = math.log(high) - math.log(low)  # rates in logs: no ratio high / low to overflow
    with B.using(select_backend(trial, comm)):
        run = build_run(trial, comm, reporter or Reporter(), sweep=lambda t: math.exp(math.log(low) + span * t / (steps - 1)))
        rates, losses = _sweep(run, steps)
    smoothed = _smooth(losses)
    return {"learning_rates": rates, "losses": losses, "smoothed": smoothed,
            "suggested_learning_rate": suggest(rates, smoothed), "stopped_early": len(rates) < steps}


def _sweep(run: Any, steps: int) -> tuple[list[float], list[float]]:
    """One update per rate of the optimizer's sweep, through the epochs' batches (as many epochs as it
    takes), until the rates are done or the loss diverges."""
    trainer, data = run.trainer, run.data.train
    choose_convolutions(trainer, data.x)
    if trainer.conv_algorithms is not None:
        run.network.set_conv_algorithms(trainer.conv_algorithms)
    x, y = B.to_device(data.x), B.to_device(data.y)
    rates, losses, best, batches, step, average = [], [], math.inf, [], 0, 0.0
    epoch = trainer.position.epoch
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for _ in range(steps):
            if step == len(batches):  # the next epoch's batches
                epoch += 1 if batches else 0
                batches, step = trainer.batches(len(data.x), epoch), 0
            step += 1
            rates.append(trainer.opt.lr())
            loss_sum, _ = trainer.step(trainer.micro_batches(batches, step, x, y), len(batches[step - 1]), epoch)
            losses.append(float(loss_sum) / len(batches[step - 1]))
            average, smooth = _smooth_step(average, losses[-1], len(losses))
            best = min(best, smooth)
            if not math.isfinite(smooth) or smooth > DIVERGED * best:
                break
    return rates, losses


def said(result: dict[str, Any], low: float, command: str) -> str:
    """What lr-find tells the user of a sweep: its range, and the suggested rate with the command that
    trains with it (or why there is none)."""
    rate = result["suggested_learning_rate"]
    ended = " (stopped early: the loss diverged)" if result["stopped_early"] else ""
    return (f"{len(result['learning_rates'])} steps from {low:g} to {result['learning_rates'][-1]:.3g}{ended}; "
            + (f"suggested learning rate {rate:.3g} (steepest descent of the smoothed loss)\n{command}" if rate
               else "no rate suggested: the loss never fell (try a wider --min/--max or more --steps)"))


def _smooth_step(average: float, loss: float, n: int) -> tuple[float, float]:
    """The exponential average after the n-th loss, and its bias-corrected value (the smoothed loss)."""
    average = SMOOTHING * average + (1 - SMOOTHING) * loss
    return average, average / (1 - SMOOTHING ** n)


def _smooth(losses: list[float]) -> list[float]:
    """Every step's smoothed loss (`_smooth_step` over the losses)."""
    average, out = 0.0, []
    for n, loss in enumerate(losses, start=1):
        average, smooth = _smooth_step(average, loss, n)
        out.append(smooth)
    return out


def suggest(rates: list[float], smoothed: list[float]) -> float | None:
    """The rate where the smoothed loss falls fastest against log(rate), the first SKIP_START steps
    and the last (a diverging one) left out; None when too few steps or no descent."""
    finite = [i for i, v in enumerate(smoothed) if math.isfinite(v)]
    end = (finite[-1] if finite else 0) + 1
    values, logs = np.array(smoothed[SKIP_START:end - 1]), np.log(np.array(rates[SKIP_START:end - 1]))
    if len(values) < 3:
        return None
    slope = np.gradient(values, logs)
    steepest = int(np.argmin(slope))
    return float(rates[SKIP_START + steepest]) if slope[steepest] < 0 else None


def train_command(config_path: Path, rate: float | None) -> str | None:
    return None if rate is None else shlex.join(["magmadnn", "train", str(config_path), "--set",
                                                 f"optimizer.learning_rate={rate:.3g}"])


def plot(result: dict[str, Any], out: Path, overwrite: bool) -> None:
    """The smoothed loss against the rate (log scale), the suggestion marked, as a PNG (or PDF, SVG)."""
    check_output_file(out, overwrite=overwrite)  # checked before the sweep too (check_arguments)
    plt = pyplot()
    figure, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(result["learning_rates"], result["losses"], color="0.75", linewidth=0.8, label="loss")
    ax.plot(result["learning_rates"], result["smoothed"], color="C0", label="smoothed loss")
    if result["suggested_learning_rate"] is not None:
        ax.axvline(result["suggested_learning_rate"], color="C3", linestyle="--",
                   label=f"suggested {result['suggested_learning_rate']:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    finite = [v for v in result["smoothed"] if math.isfinite(v)]
    if finite:
        ax.set_ylim(min(finite) * 0.9 if min(finite) > 0 else None, max(finite[:max(1, len(finite) // 2)]) * 1.3)
    ax.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format=image_format(out), dpi=100)
    plt.close(figure)
    atomic_write(out, lambda f: f.write(buffer.getvalue()))
