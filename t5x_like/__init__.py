"""t5x_like: a JAX/Flax codebase for studying how language models are pre-trained.

Layers (each may import only those to its left): data -> kernels -> models -> train -> scripts.
See DESIGN.md for the contracts between them.
"""

__version__ = "0.1.0"

from t5x_like.runtime import tf_setup as _tf_setup

_tf_setup.install()  # TensorFlow (tf.data only): no GPUs, no start-up noise; see tf_setup.py
