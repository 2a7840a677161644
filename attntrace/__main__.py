"""`python -m attntrace` and the `attntrace` console script: Ctrl-C during the imports ends quietly (130)."""

import sys


def entry() -> None:
    try:
        from attntrace.cli import EXIT_INTERRUPTED, main
    except KeyboardInterrupt:
        sys.exit(130)
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    entry()
