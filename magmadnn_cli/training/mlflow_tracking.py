"""An MLflow run per training (`tracking.mlflow`), through MLflow's client (mlflow-skinny suffices):
the resolved config flattened as parameters, the metrics per epoch (and step/loss every N updates),
and at the end the model file, its ONNX export when the run folder holds one, the config and the
metrics as artifacts. The run's id is kept in the run folder (mlflow_run.json), so `--resume`
continues the same MLflow run. mlflow is imported only when the run begins. An HTTP server that does
not answer within a few seconds is a warning, and the run goes on without MLflow (its client would
retry for minutes); MLflow's later requests are bounded in time and retries too.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any

from ..config.schema import MlflowTracking
from ..errors import MagmaError
from ..files import write_json
from .run_folder import RunFolder
from .tracking import TrackerUnavailable

STATE = RunFolder.MLFLOW
ARTIFACTS = (RunFolder.MODEL, RunFolder.ONNX, RunFolder.CONFIG, RunFolder.METRICS, RunFolder.HISTORY)
ANSWER_SECONDS = 5.0  # a tracking server silent this long is left out (MLflow's client retries for minutes)
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}  # later calls bounded too (a user's own settings win)


def probe(uri: str, seconds: float = ANSWER_SECONDS) -> None:
    """Raise TrackerUnavailable unless the HTTP(S) server at `uri` answers a request within `seconds`
    (any answer: MLflow's client says what it means); other URIs (file:, databricks) are left to MLflow."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + seconds
    try:
        with socket.create_connection((parts.hostname, port), timeout=seconds) as raw:
            conn: Any = raw
            if parts.scheme == "https":  # liveness only: the certificate is MLflow's to check
                context = ssl.create_default_context()
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                conn = context.wrap_socket(raw, server_hostname=parts.hostname)
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            conn.sendall(f"GET /health HTTP/1.1\r\nHost: {parts.hostname}\r\nConnection: close\r\n\r\n".encode())
            if not conn.recv(1):
                raise TrackerUnavailable(f"tracking.mlflow: {uri}: the server closed the connection without an answer")
    except TimeoutError:
        raise TrackerUnavailable(f"tracking.mlflow: {uri}: no answer within {seconds:g} s") from None
    except OSError as exc:
        raise TrackerUnavailable(f"tracking.mlflow: {uri}: cannot be reached ({exc.strerror or exc})") from None


def _key(name: str) -> str:
    """A parameter name MLflow accepts (letters, digits, _ - . / : and spaces)."""
    return re.sub(r"[^A-Za-z0-9_\-. /:]", "_", name)[:250]


class Mlflow:
    def __init__(self, spec: MlflowTracking, name: str, out_dir: Path, resumed: bool) -> None:
        self.uri = spec.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        self.experiment, self.out_dir, self.resumed = spec.experiment or name, out_dir, resumed
        self.client: Any = None
        self.run_id = ""
        self.pending: list[Any] = []
        self.written: set[tuple[str, int]] = set()

    def begin(self, params: dict[str, Any], config_text: str) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise MagmaError(f"tracking.mlflow: MLflow cannot be imported ({exc}); install it with: "
                             "pip install 'magmadnn-cli[mlflow]'") from exc
        self.metric = Metric
        probe(self.uri)
        for key, value in HTTP_LIMITS.items():
            os.environ.setdefault(key, value)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            run = self._continued() if self.resumed else None
            if run is None:
                found = self.client.get_experiment_by_name(self.experiment)
                experiment = found.experiment_id if found else self.client.create_experiment(self.experiment)
                run = self.client.create_run(experiment, run_name=self.out_dir.name,
                                             tags={"magmadnn.run_folder": str(self.out_dir.absolute())})
            self.run_id = run.info.run_id
            had = run.data.params
            new = {_key(k): v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in new.items() if k not in had])
            self.written = {(key, m.step) for key in run.data.metrics
                            for m in self.client.get_metric_history(self.run_id, key)}
        except MagmaError:
            raise
        except Exception as exc:  # MLflow's own errors: a refused store, a server that does not answer
            raise MagmaError(f"tracking.mlflow: {self.uri}: {exc}") from exc
        write_json(self.out_dir / STATE, {"tracking_uri": self.uri, "experiment": self.experiment,
                                          "run_id": self.run_id})

    def _continued(self) -> Any:
        """The MLflow run a resumed run continues: the one its folder names, if it is still there."""
        try:
            state = json.loads((self.out_dir / STATE).read_text())
            if state.get("tracking_uri") != self.uri:
                return None
            run = self.client.get_run(state["run_id"])
        except Exception:  # noqa: BLE001  no earlier MLflow run, or it was deleted: a new one
            return None
        if run.info.lifecycle_stage != "active":
            return None
        self.client.update_run(run.info.run_id, status="RUNNING")
        return run

    def log(self, step: int, values: dict[str, float]) -> None:
        stamp = int(time.time() * 1000)
        self.pending += [self.metric(key, value, stamp, step) for key, value in values.items()
                         if (key, step) not in self.written]
        self.written |= {(key, step) for key in values}

    def sync(self) -> None:
        if self.pending and self.run_id:
            batch, self.pending = self.pending, []
            self.client.log_batch(self.run_id, metrics=batch)

    def end(self, status: str, outputs: Path | None) -> None:
        if not self.run_id:
            return
        self.sync()
        for name in ARTIFACTS if outputs is not None else ():
            if (outputs / name).is_file():
                self.client.log_artifact(self.run_id, str(outputs / name))
        self.client.set_terminated(self.run_id, status)
