"""A command's config and its ranks: the config loaded and checked against what its distributed
strategy supports; then either the command re-launched under mpiexec (ranks or hosts asked for:
--processes, --hostfile, --hosts), ending as the job ended, or this rank's communicator."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module at start: pydantic's models load when a command runs
    from ...config.schema import Config


def load_checked(config: Path, overrides: list[str] | None, draw_seed: bool = True) -> Config:
    """The config, validated, and checked against what its distributed strategy supports."""
    from ...config.loading import load_config
    from ...distributed.strategies import config_problems
    return load_config(config, overrides or [], draw_seed, checks=(config_problems,))


def config_on_ranks(config: Path, overrides: list[str] | None, layout: tuple,
                    strategy: bool = True) -> tuple[Config, Any, int | None]:
    """(config, communicator, None), or (config, None, exit code) once a re-launched job has ended
    (`layout`: --processes, --hostfile, --hosts, --oversubscribe; a job a killed rank ended, or one
    killed after a second stop signal, raises what says how to go on). Tune's ranks share out trials:
    `strategy` False, plain MPI. A missing seed stays missing: the command draws one for all ranks."""
    from ...data.text_source import refuse_streams
    from ...distributed import get_communicator
    from ...distributed.environment import check_srun_step
    from ...distributed.launcher import JobForced, processes_origin, ranks_asked, relaunch
    from .job_end import forced_job, killed_job
    check_srun_step()
    cfg = load_checked(config, overrides, draw_seed=False)
    refuse_streams(cfg.data, ranks_asked(*layout, cfg.distributed.processes))
    try:
        code = relaunch(*layout, cfg.distributed.processes, processes_origin(cfg, config))
    except JobForced as forced:  # killed after a second stop signal: how to go on
        raise forced_job(forced) from None
    if code is not None:  # the job ended: as it ended (one a killed rank ended says how to go on)
        killed = killed_job(code)
        if killed is not None:
            raise killed
        return cfg, None, code
    return cfg, get_communicator(cfg.distributed.strategy if strategy else "allreduce"), None
