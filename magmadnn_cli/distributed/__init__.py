"""Communicators (single process, MPI), the strategies that use them, and the mpiexec launcher."""

from .comm import Communicator, SingleProcess
from .strategies import STRATEGIES, Strategy, get_communicator, strategy_of

__all__ = ["Communicator", "SingleProcess", "STRATEGIES", "Strategy", "get_communicator", "strategy_of"]
