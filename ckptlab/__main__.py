"""``python -m ckptlab``."""

import sys

from .cli import main

sys.exit(main(own_process=True))
