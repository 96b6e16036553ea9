"""railgate from a checkout: ``python run.py [command] [options]`` is the ``railgate`` console script.

See ``python run.py --help``; the commands live in ``railgate/cli.py``.
"""

import sys

from railgate.cli import main

if __name__ == "__main__":
    sys.exit(main())
