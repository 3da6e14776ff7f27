"""Run the ``spectrace`` command from another source tree (a frozen baseline checkout).

Usage: ``python run_tree.py ROOT ARGS...``: ``spectrace ARGS...`` with the packages of the
checkout at ROOT (api/, tracer/, ...) in place of this environment's editable install.
"""

from __future__ import annotations

import sys

import __editable___spectrace_0_1_0_finder as finder  # the editable install's mapping

root = sys.argv[1]
for name, path in list(finder.MAPPING.items()):
    finder.MAPPING[name] = root + "/" + path.rstrip("/").rsplit("/", 1)[1]
sys.argv = ["spectrace", *sys.argv[2:]]
from spectrace.tracer.cli.main import main  # noqa: E402

sys.exit(main())
