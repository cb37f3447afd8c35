"""The process a tool runs in, not the model: how TensorFlow loads (`tf_setup`), huge pages for
XLA:CPU's buffers (`hugepages`) and the CPU a measurement ran on (`host`). Standard library only,
so every layer may import it."""
