"""``python -m spectrace.tracer``: the same as the ``spectrace`` command."""

from .cli import main

main()
