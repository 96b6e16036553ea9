"""railgate from a checkout: ``python run.py [command] [options]`` is the ``railgate`` console script.

See ``python run.py --help``; each command is a module of ``railgate/cli/`` (the table is ``railgate.cli.COMMANDS``).
"""

import sys

try:
    from railgate.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line itself is being imported
    print("interrupted while starting: nothing was run", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
