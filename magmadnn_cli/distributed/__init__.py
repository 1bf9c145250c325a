"""Communicators (single process, MPI) and the mpiexec launcher."""

from .comm import Communicator, SingleProcess, get_communicator

__all__ = ["Communicator", "SingleProcess", "get_communicator"]
