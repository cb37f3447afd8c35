"""`python -m t5x_like.convert`: see `t5x_like/convert/cli.py`."""

import sys

from t5x_like.convert.cli import main

sys.exit(main(sys.argv[1:]))
