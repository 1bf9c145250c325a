"""The tasks' declarations: what a model's targets are, and the facts about each that the config and
every command read (whether its targets are class labels, what a search or early stopping watches by
default). A loss declares the task it trains (`config/losses.py`); `binary_cross_entropy` over several
0/1 target columns, or one column of `|`-separated labels, is multi-label. The runtime half of each
task (reading and encoding targets, scoring outputs, decoding predictions) is `data/targets.py`."""

from __future__ import annotations

from dataclasses import dataclass

LABEL_SEPARATOR = "|"   # one target cell holding several labels: "drama|comedy"


@dataclass(frozen=True)
class TaskDecl:
    name: str
    labels: bool     # targets are class labels: accuracy, stratified splits, class weights, saved labels
    summary: str
    label_sets: bool = False  # any set of labels per row: several 0/1 target columns, or '|'-separated cells

    def tag(self) -> str:
        """The name its runtime class registers under (`core/registry.py`)."""
        return self.name

    @property
    def monitor(self) -> str:
        """What a search and early stopping watch unless told: validation accuracy where there is one."""
        return "val_accuracy" if self.labels else "val_loss"


DECLARATIONS: dict[str, TaskDecl] = {d.name: d for d in (
    TaskDecl("classification", True, "one class of several per row (softmax over one output per class)"),
    TaskDecl("binary", True, "one of two classes per row (one sigmoid output)"),
    TaskDecl("multilabel", True, "any set of labels per row (one sigmoid output per label)", label_sets=True),
    TaskDecl("regression", False, "one or more numbers per row (linear outputs)"),
)}


def task_named(name: str) -> TaskDecl:
    return DECLARATIONS[name]


def resolved_task(loss_task: str, target_columns: int = 1, label_sets: bool = False) -> TaskDecl:
    """The task a loss trains on these targets: a binary loss over several 0/1 columns, or over one
    column of label sets (`label_sets`), is multi-label."""
    if loss_task == "binary" and (target_columns > 1 or label_sets):
        return DECLARATIONS["multilabel"]
    return DECLARATIONS[loss_task]
