"""Convert checkpoints between T5X, Hugging Face and t5x_like (wraps `python -m t5x_like.convert`).

    python scripts/convert_checkpoint.py --from hf --to ours --input hf_dir/ --output converted/
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from t5x_like.convert.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
