"""What training tells the user to do next, naming the CLI's flags: the command that resumes an
interrupted run, and the fixes for a diverged one. The trainer reports what happened; the words
that name commands and flags are here."""

from __future__ import annotations

from pathlib import Path

from .run_folder import RunFolder


def resume_command(run_dir: Path, ranks: int = 1) -> str:
    """The command that continues the run in `run_dir` (`RunFolder.resume_command`)."""
    return RunFolder(run_dir).resume_command(ranks)


def interrupted(signal_name: str, where: str, checkpoint: Path | None, ranks: int) -> str:
    """What stopped the run at `where`, and how to continue it from `checkpoint` (None: none written)."""
    if checkpoint is None:
        return f"stopped by {signal_name} at {where}; checkpoints are off (training.checkpoint), so nothing was saved"
    return (f"stopped by {signal_name} at {where}; checkpoint written: {checkpoint}\n"
            f"Continue with: {RunFolder.holding(checkpoint).resume_command(ranks)}")


def last_checkpoint_note(checkpoint: Path | None, ranks: int) -> str | None:
    """The newest checkpoint of a run that was ended, and the command that continues it (None: none)."""
    if checkpoint is None:
        return None
    return f"last checkpoint: {checkpoint}\nContinue with: {RunFolder.holding(checkpoint).resume_command(ranks)}"


def stopped_at_once(signal_name: str, where: str, checkpoint: Path | None, ranks: int, why: str) -> str:
    """A signal that stopped training mid-step (`why`: on_signal off, or a second signal): nothing was
    written for it; how to go on from the newest `checkpoint` written before (None: none)."""
    head = f"stopped at once by {signal_name} at {where} ({why}), so no checkpoint was written for it"
    if checkpoint is None:
        return f"{head} and none was written before: nothing of the run was saved"
    return (f"{head}; the newest, written before: {checkpoint}\n"
            f"Continue with: {RunFolder.holding(checkpoint).resume_command(ranks)}")


def diverged(what: str, learning_rate: float, last_checkpoint: Path | None) -> str:
    """A diverged run's message: what became non-finite, and what to change."""
    keep = (f" The last good checkpoint is {last_checkpoint}: resume from it with --resume {last_checkpoint} and a "
            "smaller --set optimizer.learning_rate=...") if last_checkpoint else ""
    return (f"{what}. Try a smaller learning rate (now {learning_rate:.3g}), optimizer.clip_norm, or data.normalize: "
            f"standard. No model file was written.{keep}")
