"""``python -m spectrace.tracer``: the same as the ``spectrace`` command."""

from .cli.main import main

main()
