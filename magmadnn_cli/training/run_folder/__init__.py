"""A run folder: `RunFolder` names its files and resolves what commands are given; `FolderLock` /
`locked` hold it while a command writes it; `replacing` keeps an earlier run until it is replaced."""

from .folder import Kind, RunFolder, checkpoint_files, is_made, record_made, remove_made
from .holder import holder_alive
from .lock import FolderLock, locked, say_replacing
from .replacing import put_back

__all__ = ["FolderLock", "Kind", "RunFolder", "checkpoint_files", "holder_alive", "is_made", "locked", "put_back",
           "record_made", "remove_made", "say_replacing"]
