"""The `magmadnn` command (and `python -m magmadnn_cli`): stop signals are watched from the first
moment, so Ctrl-C while the libraries load says "interrupted" rather than a traceback."""

import sys

from . import signals


def main() -> None:
    with signals.watching():
        try:
            from .cli import main as run
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            sys.exit(128 + (signals.received() or 2))
        run()


if __name__ == "__main__":
    main()
