"""How a command runs on its ranks: the config checked against its strategy, the command re-launched
under mpiexec when ranks or hosts are asked for (`ranks`), and how a job that did not end by itself
ended, with how to go on (`job_end`). Shared by the commands; not a command itself."""
