"""The config schema (pydantic v2, strict): every model forbids unknown keys; layers, losses,
optimizers and schedules are discriminated unions on `type`. Knows nothing of numpy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, PositiveInt, PrivateAttr, field_validator, model_validator

from .base import PositiveFloat, Strict, problem_at, problems_at
from .data import DataConfig, SyntheticData  # noqa: F401  (re-exported: the data section)
from .layers import SAFE_NAME, Layer, ModelConfig  # noqa: F401  (Layer re-exported: the model section)
from .losses import Loss
from .optimizers import Optimizer, Schedule  # noqa: F401  (Schedule re-exported: the optimizer section)
from .rules import head_problem, layer_names
from .tasks import resolved_task, task_named

# -- training ------------------------------------------------------------------------------------
class EarlyStopping(Strict):
    monitor: Literal["val_loss", "val_accuracy", "loss", "accuracy"] = "val_loss"
    patience: Annotated[int, Field(ge=0)] = 5
    min_delta: Annotated[float, Field(ge=0.0)] = 0.0
    restore_best: bool = True


class Augmentation(Strict):
    """For (C, H, W) images; applied to training batches only, seeded by (seed, epoch, step, rank)."""
    crop_padding: Annotated[int, Field(ge=0)] = Field(0, description="random crops of the image zero-padded by this")
    horizontal_flip: bool = False


class Checkpointing(Strict):
    """Checkpoints in <run dir>/checkpoints: every N epochs and/or N steps, and on SIGINT/SIGTERM."""
    every_epochs: PositiveInt | None = Field(1, description="write after every N-th epoch (null: never)")
    every_steps: PositiveInt | None = Field(None, description="write after every N-th training step (null: never)")
    keep: PositiveInt = Field(2, description="how many of the newest checkpoints to keep")
    on_signal: bool = Field(True, description="on SIGINT/SIGTERM: finish the step, write a checkpoint, exit")


class TrainingConfig(Strict):
    epochs: Annotated[int, Field(ge=0)] = 10
    batch_size: PositiveInt = 32
    batch_schedule: dict[PositiveInt, PositiveInt] | None = Field(
        None, description="growing global batches: {epoch: batch size from that epoch on}, e.g. {5: 256, 10: 1024}; "
                          "batch_size until the first")
    gradient_accumulation_steps: PositiveInt = Field(
        1, description="K: each update is one step on K consecutive batches of batch_size (the mean over their "
                       "rows; an epoch's last group may be shorter), in the memory of one batch; batchnorm "
                       "statistics stay per batch")
    shuffle: bool = True
    early_stopping: EarlyStopping | None = None
    eval_batch_size: PositiveInt = Field(
        1024, description="rows per evaluation and prediction batch; on the CPU at most what keeps a batch's "
                          "layer outputs within 8 MB (bigger batches leave the caches and run slower a row)")
    augment: Augmentation | None = None
    class_weight: Union[Literal["balanced"], dict[Union[int, str], PositiveFloat], None] = Field(
        None, description="weight each class's loss: balanced = rows / (classes x the class's rows), or "
                          "{label: weight} (unlisted labels weigh 1); validation and test losses stay unweighted")
    checkpoint: Checkpointing | None = Field(default_factory=Checkpointing,
                                             description="null or false: no checkpoints (and Ctrl-C just stops)")
    cuda_graph: Union[Literal["auto"], Literal[False]] = Field(
        False, description="auto: on a GPU, capture the training step as a CUDA graph per batch shape after a "
                           "warm-up step and replay it (a step that cannot be captured runs eagerly, said once); "
                           "false: every step eagerly")

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _checkpoint_switch(cls, value: Any) -> Any:
        """`checkpoint: false` turns checkpoints off, `checkpoint: true` keeps the defaults."""
        return {False: None, True: {}}.get(value, value) if isinstance(value, bool) else value


class DistributedConfig(Strict):
    """The names only: what each strategy supports (split layers, max_staleness) is declared, and
    checked, by the registry (`distributed.strategies`), which the config cannot import."""
    processes: PositiveInt = 1
    strategy: Literal["auto", "allreduce", "ring", "parameter_server", "shared_memory", "async"] = Field(
        "auto", description="auto: shared_memory when all ranks share one node (CPU), else allreduce; async: "
        "asynchronous SGD, rank 0 serving the weights to the other ranks")
    sync_batchnorm: bool = Field(True, description="batchnorm statistics over the global batch (N ranks = 1 "
                                 "process); false: per-rank statistics, cheaper, results depend on the rank count")
    model_parallel: PositiveInt = Field(1, description="split every dense layer's units over this many ranks "
                                        "(ranks = data-parallel groups x model_parallel)")
    max_staleness: Annotated[int, Field(ge=0)] | None = Field(
        None, description="strategy async: a gradient is applied at most this many steps after the weights it was "
        "computed on were served (0: one process's run exactly); default: 2 x the workers")
    timeout: Annotated[float, Field(ge=0)] | None = Field(
        600.0, description="seconds a rank may wait in one collective of the training loop before the job is ended, "
        "naming the rank that stopped answering (a stopped or frozen rank, a network split); 0 or null: wait "
        "forever. 10 minutes, as torch.distributed's NCCL default: beyond any healthy wait (a checkpoint written "
        "by rank 0) and short of burning a cluster allocation on a hung job")

    @model_validator(mode="after")
    def _split_fits(self) -> "DistributedConfig":
        if self.model_parallel > 1 and self.processes > 1 and self.processes % self.model_parallel:
            raise problem_at(self, ("model_parallel",), f"{self.model_parallel} does not divide processes: "
                             f"{self.processes}; use a multiple of {self.model_parallel} processes")
        return self


class Distribution(Strict):
    uniform: list[float] | None = Field(None, min_length=2, max_length=2)
    loguniform: list[PositiveFloat] | None = Field(None, min_length=2, max_length=2)
    int_uniform: list[int] | None = Field(None, min_length=2, max_length=2)

    @model_validator(mode="after")
    def _exactly_one(self) -> "Distribution":
        given = [k for k in ("uniform", "loguniform", "int_uniform") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of uniform, loguniform, int_uniform: [low, high]")
        low, high = getattr(self, given[0])
        if low > high:
            raise ValueError(f"{given[0]}: low must not exceed high; received [{low}, {high}]")
        return self


class SearchConfig(Strict):
    method: Literal["grid", "random"] = "grid"
    trials: PositiveInt = 10
    space: dict[str, Union[Annotated[list[Any], Field(min_length=1)], Distribution]] = Field(default_factory=dict)
    objective: Union[Literal["auto", "val_accuracy", "val_loss", "time"],
                     Annotated[dict[Literal["val_accuracy", "val_loss", "time"], float], Field(min_length=1)]] = Field(
        "auto", description="auto: val_accuracy for a classification loss, val_loss for a regression loss")
    direction: Literal["maximize", "minimize", "auto"] = Field(
        "auto", description="auto: maximize val_accuracy, minimize val_loss and time; a weighted mix of "
                            "several needs maximize or minimize")
    stop_when: float | None = None
    early_stop: Literal["none", "median", "halving"] = "none"
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    folds: Annotated[int, Field(ge=2, le=100)] | None = Field(
        None, description="choose on K-fold cross-validated scores (stratified) instead of one validation split")

    @model_validator(mode="after")
    def _direction_is_known(self) -> "SearchConfig":
        if isinstance(self.objective, dict) and len(self.objective) > 1 and self.direction == "auto":
            raise problem_at(self, ("objective",), f"objective {dict(self.objective)} mixes several metrics: set "
                             "search.direction to maximize or minimize (e.g. maximize for {val_accuracy: 1.0, time: -0.01})")
        return self


# -- tracking ------------------------------------------------------------------------------------
class MlflowTracking(Strict):
    """An MLflow run per training: the config flattened as parameters, the metrics per epoch, the model
    file as an artifact (needs `pip install 'magmadnn-cli[mlflow]'`)."""
    tracking_uri: str | None = Field(None, min_length=1, description="e.g. http://host:5000 or file:/abs/mlruns; "
                                     "null: the MLFLOW_TRACKING_URI environment variable")
    experiment: str | None = Field(None, min_length=1, description="the experiment's name (null: the config's name)")


class Tracking(Strict):
    """Where runs are logged beside metrics.csv (rank 0 writes; a resumed run continues its logs)."""
    tensorboard: Union[bool, Path] = Field(False, description="true: TensorBoard event files in <run folder>/tensorboard; "
                                           "a folder: there (relative to the run folder)")
    mlflow: MlflowTracking | None = None
    log_every_steps: PositiveInt = Field(10, description="step/loss every N optimizer steps (the epoch scalars always)")

    @field_validator("mlflow", mode="before")
    @classmethod
    def _mlflow_switch(cls, value: Any) -> Any:
        """`mlflow: true` logs with the defaults (MLFLOW_TRACKING_URI), `mlflow: false` does not."""
        return {False: None, True: {}}.get(value, value) if isinstance(value, bool) else value

    @field_validator("tensorboard")
    @classmethod
    def _a_folder_is_named(cls, value: Any) -> Any:
        if isinstance(value, Path) and str(value) in ("", "."):
            raise ValueError("give a folder name, or true for <run folder>/tensorboard")
        return value


class Config(Strict):
    name: str = Field(pattern=SAFE_NAME, description="run name (letters, digits, _ . -; not starting with . or -); "
                      "outputs go to runs/<name>")
    seed: int | None = Field(None, ge=0, lt=2**63, description="None: a random seed is drawn and recorded")
    device: Literal["auto", "cpu", "gpu"] = "auto"
    precision: Literal["float32", "float64", "mixed_bfloat16", "mixed_float16"] = Field(
        "float32", description="float32 | float64 | mixed_bfloat16 | mixed_float16 (float32 weights; matmul and "
                               "convolution operands in the half type, summed in float32; float16 scales the loss)")
    memory: Literal["device", "managed"] = Field("device", description="GPU memory: device, or CUDA managed (unified)")
    data: DataConfig
    model: ModelConfig
    loss: Loss
    optimizer: Optimizer
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    search: SearchConfig | None = None
    tracking: Tracking | None = Field(None, description="TensorBoard event files and/or an MLflow run")
    _source: Any = PrivateAttr(None)  # (file, lines, --set origins) when loaded from a file: see `where`

    def __eq__(self, other: object) -> bool:
        """Equal by value: where a config was read from (`_source`) is not part of it."""
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def where(self, *key: str | int) -> str | None:
        """'file:line' (or the --set) that gave `key`, for a problem found after loading (the data's
        output width, say); None for a config built in code."""
        from .messages import where  # messages reads this module's models
        return where(key, *self._source) if self._source is not None else None

    @model_validator(mode="before")
    @classmethod
    def _loss_shorthand(cls, data: Any) -> Any:
        """`loss: cross_entropy` means `loss: {type: cross_entropy}` (likewise `optimizer: sgd`)."""
        if isinstance(data, dict):
            for key in ("loss", "optimizer"):
                if isinstance(data.get(key), str):
                    data = {**data, key: {"type": data[key]}}
        return data

    @model_validator(mode="after")
    def _objective_of_the_task(self) -> "Config":
        """search.objective auto becomes the task's metric (`tune` checks that it can be measured)."""
        if self.search is not None and self.search.objective == "auto":
            self.search.objective = task_named(self.loss.task).monitor
        return self

    @model_validator(mode="after")
    def _whole_config_checks(self) -> "Config":
        """The checks across sections, every problem said at once, each at the key to fix."""
        problems = [*self._duplicate_layer_names(), *([head] if (head := head_problem(self.model.layers,
                                                                                     self.loss.type)) else [])]
        if self.training.class_weight is not None and not task_named(self.loss.task).labels:
            problems.append((("training", "class_weight"), f"class_weight weighs classes; loss {self.loss.type} is a "
                             "regression loss: remove class_weight"))
        if self.data.label_columns and not resolved_task(self.loss.task, len(self.data.label_columns)).label_sets:
            problems.append((("loss",), f"data.target lists {len(self.data.label_columns)} 0/1 columns, one per label "
                             f"(multi-label), which loss {self.loss.type} does not train: use loss: "
                             "binary_cross_entropy"))
        if problems:
            raise problems_at(self, problems)
        return self

    @property
    def run_seed(self) -> int:
        """The seed a run uses: its own (drawn once by `loading.seeded` where the config has none), or
        0 for the commands that draw none (lr-find, summary, validate): the one default."""
        return self.seed if self.seed is not None else 0

    def with_data_settled(self, settled: dict[str, Any]) -> "Config":
        """The config with the data settings read off the training file (its number style, an image
        folder's size and color, 8-bit scaling): saved, so new files are read alike."""
        return self.revised(data=self.data.revised(**settled)) if settled else self

    def with_convolutions(self, ran: list[str]) -> "Config":
        """The config with each `auto` or `fastest` convolution pinned to the algorithm it ran: `fastest`
        times the machine, so a written config repeats its run only with the choices pinned (and a
        pinned auto layer keeps its algorithm if a later version changes the rule)."""
        return self.revised(model=self.model.with_convolutions(ran)) if ran else self

    def _duplicate_layer_names(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Weights are stored by layer name: two layers of one name would overwrite each other."""
        seen: dict[str, str] = {}
        found = []
        for where, name in layer_names(self.model.layers):
            if name in seen:
                found.append((tuple(int(p) if p.isdigit() else p for p in where.split(".")),
                              f"named {name!r}, like {seen[name]}: weights are saved by layer name, so names must "
                              "be unique (rename one, or leave names out: <type>_<index> is the default)"))
            seen.setdefault(name, where)
        return found


def union_tags(annotation: Any) -> set[str]:
    """The `type` tags of a discriminated union of config models (e.g. `union_tags(Layer)`)."""
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return set(get_args(annotation.model_fields["type"].annotation))
    return {tag for arg in get_args(annotation) for tag in union_tags(arg)}
