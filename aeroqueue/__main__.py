"""The `aeroqueue` command's entry point: `python -m aeroqueue`, and the console
script (pyproject's [project.scripts] names `main`).

Ctrl-C while Python imports the command line (click, rich, the client: some
tenths of a second) raised KeyboardInterrupt out of an import, and Python
printed its traceback: a command stopped that early now ends as one stopped
later does, with the one line and status 130. This module and the package's
`__init__` import next to nothing, so that little runs before `main` is called.
"""

import sys

# As aeroqueue.cli.context's EXIT_INTERRUPTED (not imported from there: importing
# it is what takes the time).
EXIT_INTERRUPTED = 130


def main() -> None:
    try:
        from .cli import main as command_line

        command_line()
    except KeyboardInterrupt:
        # Raised before click took over (during the imports) or after it let go;
        # within a command, click turns it into these same lines (a blank one
        # first, after the terminal's "^C") and status.
        sys.stderr.write("\nerror: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
