"""pytest, whole checkout: the doctests of an optional adapter are collected only when its
dependency is installed (``railgate/trl`` needs the ``trl`` extra; CI installs it)."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("trl") else ["railgate/trl/*"]
