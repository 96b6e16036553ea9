"""railgate from a checkout: ``python run.py [command] [options]`` is the ``railgate`` console script.

See ``python run.py --help``; each command is a module of ``railgate/cli/`` (the table is ``railgate.cli.COMMANDS``).
"""

import sys

from railgate.cli import main

if __name__ == "__main__":
    sys.exit(main())
