"""``python -m t5x_like.train --gin_file=gin/runs/X.gin --gin.KEY=VALUE [--model_dir DIR]``.

T5X-style flags: ``--gin_file`` (repeatable), ``--gin_bindings`` (repeatable) and the shorthand
``--gin.KEY=VALUE`` (e.g. ``--gin.train.batch_size=64``), ``--gin_search_paths`` (comma separated,
repeatable), ``--model_dir`` (= ``train.model_dir``), and for multi-process runs
``--coordinator_address/--num_processes/--process_id``. Config errors (unknown or misspelled
bindings, missing required ones) exit with status 2 before any compute.
"""

from __future__ import annotations

import sys

from t5x_like.runtime.hugepages import reexec_with_hugepages

if __name__ == "__main__":
    reexec_with_hugepages()  # huge pages for XLA:CPU's buffers; see t5x_like/runtime/hugepages.py
    from t5x_like.train.cli import main  # after the re-exec: its imports take 2.5 s

    sys.exit(main(sys.argv[1:]))
