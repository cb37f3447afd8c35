# The two README commands: `make pretrain` (the main job) and `make test` (the suite; .ci/run calls it).
# Each creates ./.venv and installs the pinned requirements first (re-installs when they change).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
AOT_VENV ?= .venv-aot
AOT_PY := $(AOT_VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2
# Installs go through uv (pinned; pip installs it into the venv first): the same resolution as pip,
# about 3x faster (parallel downloads, no bytecode pass: `make test` writes the .pyc files of what
# the tests import). It reads pip's find-links folder where the machine has one (e.g. a CPU build of
# torch on disk).
UV_VERSION := 0.13.9
# nvdisasm for the kernels' SASS (`make check-kernels`), in $(AOT_VENV)/cuda-tools, off sys.path:
# its wheel's `nvidia.cu13` package would make jax take it for the CUDA root (no ptxas there).
NVDISASM_VERSION := 13.5.37
ifneq ($(PIP_FIND_LINKS),)
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif
uv_install = $(1) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION) && \
	$(1) -m uv pip install -q --python $(1)

# The package itself is installed editable, so `python -m t5x_like.*` works from any directory.
$(VENV)/.runtime-installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call uv_install,$(PY)) -r requirements.txt
	$(PY) -m uv pip install -q --python $(PY) --no-deps -e .
	touch $@

# Offline GPU/TPU compilers (python -m t5x_like.aot, the kernel compile check): their own venv,
# so CUDA/TPU plugins never load in the training or test venv.
$(AOT_VENV)/.aot-installed: requirements-aot.txt requirements.txt
	test -x $(AOT_PY) || $(PYTHON) -m venv $(AOT_VENV)
	$(call uv_install,$(AOT_PY)) -r requirements-aot.txt
	$(AOT_PY) -m uv pip install -q --python $(AOT_PY) --no-deps -e .
	$(AOT_PY) -m uv pip install -q --python $(AOT_PY) --target $(AOT_VENV)/cuda-tools \
		nvidia-cuda-nvdisasm==$(NVDISASM_VERSION)
	$(AOT_PY) -c "from t5x_like.aot import gpu; gpu.link_nvdisasm()"
	touch $@

$(VENV)/.test-installed: requirements-test.txt $(VENV)/.runtime-installed
	$(call uv_install,$(PY)) -r requirements-test.txt
	touch $@

.PHONY: install install-test install-aot pretrain test lint check-kernels check-gpu-kernels \
	check-tpu-kernels
install: $(VENV)/.runtime-installed
install-test: $(VENV)/.test-installed
install-aot: $(AOT_VENV)/.aot-installed

# Main job: fetch + clean the embedded corpus, build the vocabulary, run a short pre-training.
pretrain: $(VENV)/.runtime-installed
	$(PY) -m t5x_like.data.prepare
	$(PY) -m t5x_like.train --gin_file=gin/runs/quickstart.gin $(ARGS)

lint: $(VENV)/.test-installed
	$(PY) -m ruff check t5x_like scripts tests notebooks

# One pytest worker per core (at most 4; TEST_WORKERS=0 runs in-process), each taking whole test
# files so module/session fixtures (a trained tiny model, compiled steps) are built once per worker,
# in collection order (costliest first: tests/conftest.py), not xdist's default most-tests-first.
# PYTHONDONTWRITEBYTECODE is cleared (CI sets it): else each of the suite's hundreds of Python
# subprocesses compiles jax, tensorflow and the package from source again (~3 s each).
TEST_WORKERS ?= auto
test: $(VENV)/.test-installed lint
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses=4 \
		--dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Compiles every flash-attention kernel variant for sm_80, sm_86, sm_89 and sm_90 with the real
# GPU compiler (no GPU): fails when one stops compiling, spills registers or loses its pipelined
# loads. And the TPU kernels with libtpu for v4, v5e, v5p and v6e (fwd and fwd+bwd; plain, T5
# table, segments; default blocks): fails when one stops compiling. The GPU half also compiles
# a tiny model's 'pallas' train step for the H100 and fails without its step models (the
# roofline and the flash kernels' latency model). `make -j2 -Otarget check-kernels` runs the two
# at once (CI does).
check-kernels: check-gpu-kernels check-tpu-kernels
check-gpu-kernels: $(AOT_VENV)/.aot-installed
	JAX_PLATFORMS=cpu $(AOT_PY) scripts/check_gpu_kernels.py
	@# the step models of an H100 'pallas' step (roofline + the flash kernels' latency model)
	JAX_PLATFORMS=cpu $(AOT_PY) -m t5x_like.aot --target=h100 --gin_file=gin/models/tiny.gin \
		--gin_file=gin/runs/pretrain.gin "--gin.TransformerConfig.attention_impl='pallas'" \
		--gin.train.batch_size=32 --no_plan --quiet > /tmp/t5x_like_aot_h100.txt
	grep "latency model" /tmp/t5x_like_aot_h100.txt
check-tpu-kernels: $(AOT_VENV)/.aot-installed
	JAX_PLATFORMS=cpu $(AOT_PY) scripts/compile_tpu_kernels.py --head-dims=128 \
		--variants=causal,causal_rel,segments
