"""``python -m spectrace.engine``: run the reference speculative-decoding engine."""

import sys

from .cli import main

sys.exit(main())
