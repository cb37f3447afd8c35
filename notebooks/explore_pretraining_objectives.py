# Source of explore_pretraining_objectives.ipynb ("percent" format): edit, then run
# `python notebooks/build_notebook.py`. Lines before the first cell marker are not copied.
# ruff: noqa: E402
# %% [markdown]
# # Exploring pre-training objectives with t5x_like
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/t5x-like/t5x_like/blob/main/notebooks/explore_pretraining_objectives.ipynb)
#
# Everything below is drawn by the project's own code, not re-implemented here:
# 1. **Objectives**: one `c4like` paragraph through every objective of the T5 paper (Raffel et
#    al. 2020, §3.3), decoded, with its noise mask as a coloured strip (`t5x_like.data.preview`).
# 2. **Attention masks** of encoder-decoder, decoder-only and prefix-LM models on a packed row
#    (`t5x_like.models.attention.make_mask_spec`).
# 3. **Position encodings**: T5's relative-position buckets and RoPE's "clock hands".
# 4. **Training** a tiny encoder-decoder (span corruption) and a tiny decoder-only LM through the
#    real trainer; loss curves from `metrics.jsonl`; what they decode.
# 5. **The T5 tables at tiny scale**: our committed sweep results against the paper's numbers.
#
# It runs unchanged on a Colab CPU, GPU or TPU runtime (the set-up cell installs the project)
# and in any checkout. CI runs it with `T5X_LIKE_NOTEBOOK_SMALL=1` (a few training steps).

# %%
# Set-up. On Colab: clone the repository, install the pinned stack (+ JAX for the accelerator),
# restart the runtime once if Colab had already imported older versions. Elsewhere: use this
# checkout. Then build the data directory (corpus + vocabularies; a no-op when already built).
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_URL = "https://github.com/t5x-like/t5x_like"
JAX_VERSION = "0.10.2"
SMALL = os.environ.get("T5X_LIKE_NOTEBOOK_SMALL") == "1"  # CI: fewer steps, shorter sequences
IN_COLAB = "google.colab" in sys.modules
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def accelerator() -> str:
    """'tpu', 'gpu' or 'cpu', found without importing JAX (it is not installed yet on Colab)."""
    tpu_vars = os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_ACCELERATOR_TYPE")
    if tpu_vars or list(Path("/dev").glob("accel*")):
        return "tpu"
    has_gpu = shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0
    return "gpu" if has_gpu else "cpu"


def find_repo_root() -> Path:
    """The checkout holding this notebook: the current directory or one of its parents."""
    for path in [Path.cwd(), *Path.cwd().parents]:
        if (path / "t5x_like" / "__init__.py").exists() and (path / "gin").is_dir():
            return path
    raise FileNotFoundError(f"no t5x_like checkout at or above {Path.cwd()}; run the notebook "
                            f"from the repository (or clone {REPO_URL})")


if IN_COLAB:
    REPO_ROOT = Path("/content/t5x_like")
    if not REPO_ROOT.exists():
        subprocess.run(["git", "clone", "--depth=1", REPO_URL, str(REPO_ROOT)], check=True)
    installed = REPO_ROOT / ".colab_installed"
    if not installed.exists():
        preloaded = [m for m in ("numpy", "jax", "tensorflow", "google.protobuf")
                     if m in sys.modules]
        pip = [sys.executable, "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "-r", str(REPO_ROOT / "requirements.txt")], check=True)
        extra = {"gpu": f"jax[cuda12]=={JAX_VERSION}", "tpu": f"jax[tpu]=={JAX_VERSION}"}
        if accelerator() in extra:
            subprocess.run([*pip, extra[accelerator()]], check=True)
        installed.touch()
        if preloaded:
            print(f"Installed. Colab had already imported {preloaded}: restarting the runtime; "
                  "run all cells again (the set-up is then skipped).")
            os.kill(os.getpid(), 9)
else:
    REPO_ROOT = find_repo_root()
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import tensorflow as tf

tf.config.set_visible_devices([], "GPU")  # tf.data runs on the CPU; leave the GPU to JAX

import jax

from t5x_like.data import prepare

for step, what in prepare.prepare().items():
    print(f"{step}: {what}")
print(f"python {sys.executable}")
print(f"jax {jax.__version__} on {jax.default_backend()} ({jax.device_count()} devices); "
      f"repository {REPO_ROOT}; SMALL={SMALL}")

# %% [markdown]
# ## 1. One paragraph through every objective
#
# Every objective of the paper is *noise mask × inputs transform × targets transform* over a
# chunk of a document (`t5x_like/data/objectives.py`). `t5x_like.data.preview.preview_task`
# runs the registered SeqIO task on the first validation document and keeps the noise mask, so
# the text and the strips below are exactly what training sees (with the `c4like_8k`
# vocabulary and 64 input tokens). In the figure each objective gets three strips, one cell per
# token: the raw chunk (orange = noise), then the inputs and the targets the model sees
# (purple = sentinel, black = EOS). Things to notice:
#
# - **CLM** has no inputs; **prefix LM** cuts the chunk at a random point (noise = the suffix).
# - **BERT-style** (noise -> 80% mask token, here `<extra_id_0>`, 10% random token, 10%
#   unchanged) and **deshuffling** keep the inputs as long as the chunk and ask for the whole
#   chunk back: long, expensive targets.
# - **i.i.d. replace spans** and **span corruption** replace each noise run by one sentinel
#   (`<extra_id_k>`, the top ids of the vocabulary), so the targets are short; span corruption
#   draws fewer, longer runs (mean 3), hence fewer sentinels and shorter sequences for the same
#   15% noise: as good as i.i.d. in the paper and cheaper, T5's final choice. **Drop tokens**
#   deletes the noise and gives no hint where it was.
# - The chunk lengths differ: each objective sizes its chunk so that inputs and targets fit
#   their lengths after sentinels and EOS.

# %%
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from t5x_like.data import get_vocabulary, preview

VOCABULARY = "c4like_8k"
vocab = get_vocabulary(VOCABULARY)
FIRST_SENTINEL = vocab.vocab_size - vocab.extra_ids  # <extra_id_0> = vocab_size - 1
OBJECTIVES = {
    "full_lm": "CLM (full LM)",
    "prefix_lm": "Prefix LM",
    "bert_style": "BERT-style, 15%",
    "deshuffling": "Deshuffling",
    "iid_replace_spans": "i.i.d. replace spans, 15%",
    "iid_drop_tokens": "i.i.d. drop tokens, 15%",
    "span_corruption": "Span corruption, 15%, mean 3",
}
records = {
    name: preview.preview_task(f"c4like_{name}", vocabulary=VOCABULARY, num_examples=1,
                                    inputs_length=64, split="validation", document=0, seed=0)[0]
    for name in OBJECTIVES
}
for record in records.values():
    print(preview.format_record(record, width=110), end="\n\n")

# %%
CATEGORIES = ["kept token", "noise token", "sentinel", "EOS", "token"]
COLOURS = ["#d9d9d9", "#f28e2b", "#7b3294", "#222222", "#4e79a7"]


def token_categories(ids: list[int]) -> list[int]:
    """Category per id for the inputs / targets strips: sentinel, EOS or any other token."""
    return [2 if i >= FIRST_SENTINEL else 3 if i == vocab.eos_id else 4 for i in ids]


width = max(max(len(r.chunk), len(r.inputs or []), len(r.targets)) for r in records.values())
fig, axes = plt.subplots(len(records), 1, figsize=(15, 1.05 * len(records) + 1.6))
for ax, (name, r) in zip(axes, records.items(), strict=True):
    strips = np.full((3, width), -1)
    strips[0, : len(r.chunk)] = np.asarray(r.noise_mask, int)
    if r.inputs is not None:
        strips[1, : len(r.inputs)] = token_categories(r.inputs)
    strips[2, : len(r.targets)] = token_categories(r.targets)
    ax.imshow(np.ma.masked_less(strips, 0), cmap=ListedColormap(COLOURS), vmin=0, vmax=4,
              aspect="auto", interpolation="nearest")
    ax.set_yticks(range(3), ["chunk", "inputs", "targets"], fontsize=8)
    ax.set_xticks(np.arange(-0.5, width), minor=True)
    ax.set_xticks(np.arange(0, width, 8), [])
    ax.grid(which="minor", axis="x", color="white", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    inputs = "no inputs" if r.inputs is None else f"{len(r.inputs)} inputs"
    ax.set_title(f"{OBJECTIVES[name]}: {len(r.chunk)}-token chunk, {r.noise_density:.0%} noise "
                 f"-> {inputs}, {len(r.targets)} targets", loc="left", fontsize=9)
longest = max(records.values(), key=lambda r: len(r.chunk))
axes[0].xaxis.set_tick_params(labeltop=True, labelbottom=False, top=True)
axes[0].set_xticks(range(len(longest.chunk)), longest.chunk_pieces, rotation=90, fontsize=6)
axes[-1].set_xticks(np.arange(0, width, 8), np.arange(0, width, 8))
axes[-1].set_xlabel("token position (chunks of all objectives start at the same token)")
fig.legend(handles=[Patch(color=c, label=n) for c, n in zip(COLOURS, CATEGORIES, strict=True)],
           loc="lower center", ncol=5, frameon=False)
fig.tight_layout(rect=(0, 0.03, 1, 1))
plt.show()

# %% [markdown]
# ## 2. Attention masks, packed
#
# Training packs several short examples into one row; segment ids (1, 2, 3, 0 = padding) keep
# them from attending to each other. Below, three short text pairs go through the real feature
# converters (`t5x_like.data.converters`, best-fit packing) and the resulting segment ids
# through `make_mask_spec`, called with the arguments the model stacks use
# (`t5x_like/models/transformer.py`); the images are the dense masks it builds
# (`dense_mask [B, 1, Lq, Lk]`). Rows are queries, columns keys, colour = segment, white =
# masked. Note:
#
# - the encoder is **bidirectional** within each example, the decoder **causal**, and the
#   decoder's **cross-attention** sees the whole encoder input of its own example only;
# - decoder positions hold the shifted-right targets (`<s>` = the 0 BOS at each segment start);
# - the **decoder-only** LM (Table 2's "language model") reads inputs + targets causally, the
#   **prefix LM** sees its inputs bidirectionally; by SeqIO's convention the prefix also covers
#   the first target position (the last square of each bidirectional block).

# %%
import jax.numpy as jnp

from t5x_like.data.converters import get_feature_converter
from t5x_like.models.attention import make_mask_spec

PAIRS = [("The cat sat on the mat.", "It purred."), ("Rain fell all day.", "We stayed in."),
         ("Hello there!", "Hi.")]
eos = [vocab.eos_id]
examples = [{"inputs": vocab.encode(a) + eos, "targets": vocab.encode(b) + eos} for a, b in PAIRS]
lengths = {k: sum(len(e[k]) for e in examples) + 2 for k in ("inputs", "targets")}  # + padding


def packed_row(family: str) -> dict[str, np.ndarray]:
    """The three examples packed into one row by the family's feature converter."""
    signature = {k: tf.TensorSpec([None], tf.int32) for k in ("inputs", "targets")}
    ds = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=signature)
    converter = get_feature_converter(family, has_inputs=True, pack=True)
    row = next(converter(ds, lengths).as_numpy_iterator())
    return {k: v[None] for k, v in row.items()}  # batch of one


def labels(tokens: np.ndarray, segments: np.ndarray, shifted: bool) -> list[str]:
    """Token pieces for the axes; '' on padding, <s> for the decoder's BOS (0)."""
    piece = lambda t: "</s>" if t == vocab.eos_id else vocab.tokenizer.id_to_piece(int(t))
    return ["" if s == 0 else "<s>" if (shifted and t == 0) else piece(t)
            for t, s in zip(tokens[0], segments[0], strict=True)]


def mask(q_seg, kv_seg, **kwargs) -> np.ndarray:
    """`make_mask_spec(...).dense_mask` for batch element 0: bool [Lq, Lk]."""
    spec = make_mask_spec(q_segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg),
                          **kwargs)
    return np.asarray(spec.dense_mask)[0, 0]


enc_dec, lm, prefix = (packed_row(f) for f in ("encoder_decoder", "decoder_only", "prefix_lm"))
enc_seg, dec_seg = enc_dec["encoder_segment_ids"], enc_dec["decoder_segment_ids"]
lm_seg, prefix_seg = lm["decoder_segment_ids"], prefix["decoder_segment_ids"]
enc_labels = labels(enc_dec["encoder_input_tokens"], enc_seg, shifted=False)
dec_labels = labels(enc_dec["decoder_input_tokens"], dec_seg, shifted=True)
lm_labels = labels(lm["decoder_input_tokens"], lm_seg, shifted=True)
prefix_labels = labels(prefix["decoder_input_tokens"], prefix_seg, shifted=True)
prefix_mask = jnp.asarray(prefix["decoder_causal_attention"] > 0)
panels = [  # (title, allowed [Lq, Lk], query segment ids, query labels, key labels)
    ("encoder self-attention\n(bidirectional)", mask(enc_seg, enc_seg), enc_seg,
     enc_labels, enc_labels),
    ("decoder self-attention\n(causal)", mask(dec_seg, dec_seg, causal=True), dec_seg,
     dec_labels, dec_labels),
    ("cross-attention\n(decoder -> encoder)", mask(dec_seg, enc_seg, q_length=dec_seg.shape[1]),
     dec_seg, dec_labels, enc_labels),
    ("decoder-only LM\n(causal over inputs + targets)", mask(lm_seg, lm_seg, causal=True),
     lm_seg, lm_labels, lm_labels),
    ("prefix LM\n(bidirectional prefix)",
     mask(prefix_seg, prefix_seg, causal=True, prefix_mask=prefix_mask),
     prefix_seg, prefix_labels, prefix_labels),
]

SEGMENT_COLOURS = ListedColormap(["white", "#4e79a7", "#f28e2b", "#59a14f", "#e15759"])
fig, axes = plt.subplots(2, 3, figsize=(19, 13))
for ax, (title, allowed, q_seg, q_labels, k_labels) in zip(axes.flat, panels, strict=False):
    image = np.where(allowed, q_seg[0][:, None], 0)
    ax.imshow(image, cmap=SEGMENT_COLOURS, vmin=0, vmax=4, interpolation="nearest")
    ax.set_xticks(range(len(k_labels)), k_labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(q_labels)), q_labels, fontsize=7)
    ax.set_xticks(np.arange(-0.5, len(k_labels)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(q_labels)), minor=True)
    ax.grid(which="minor", color="#cccccc", linewidth=0.3)
    ax.tick_params(which="minor", length=0)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
# Last panel: the packed rows themselves (segment ids; ticks: the prefix LM's prefix).
rows = {"encoder inputs": enc_seg, "decoder targets": dec_seg, "decoder-only": lm_seg,
        "prefix LM": prefix_seg}
ax = axes.flat[-1]
strip = np.zeros((len(rows), max(r.shape[1] for r in rows.values())), int)
for k, seg in enumerate(rows.values()):
    strip[k, : seg.shape[1]] = seg[0]
ax.imshow(strip, cmap=SEGMENT_COLOURS, vmin=0, vmax=4, interpolation="nearest", aspect=3)
prefix_positions = np.flatnonzero(prefix["decoder_causal_attention"][0])
ax.scatter(prefix_positions, np.full(len(prefix_positions), len(rows) - 1), marker="|",
           color="black", s=60, label="decoder_causal_attention = 1")
ax.set_yticks(range(len(rows)), list(rows))
ax.set_xlabel("position in the packed row (white = padding, segment id 0)")
ax.set_title("packed rows: segment ids", fontsize=11)
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), frameon=False)
fig.legend(handles=[Patch(color=SEGMENT_COLOURS(i), label=f"example {i}") for i in (1, 2, 3)],
           loc="lower center", ncol=3, frameon=False, fontsize=11)
fig.tight_layout(rect=(0, 0.03, 1, 1))
plt.show()
for name, seg in rows.items():
    print(f"{name + ' segment ids:':<30}", seg[0].tolist())
print(f"{'prefix LM causal attention:':<30}", prefix["decoder_causal_attention"][0].tolist())

# %% [markdown]
# ## 3. Position encodings
#
# **T5 relative-position buckets.** T5 adds a learned scalar per head and *bucket* of the offset
# `key - query` to the attention logits. `relative_position_bucket` (the one function shared by
# the models and the flash-attention kernel) gives each small offset its own bucket and groups
# larger ones log-spaced up to `max_distance` (128); beyond it everything shares the last bucket.
# The encoder is bidirectional (half of the 32 buckets for keys after the query), the decoder
# causal (all 32 for the past; future keys are masked anyway, white here).

# %%
from t5x_like.kernels.relpos import relative_position_bucket
from t5x_like.models import TransformerConfig

t5 = TransformerConfig()  # T5 defaults: 32 buckets, max distance 128
num_buckets, max_distance = t5.relative_attention_num_buckets, t5.relative_attention_max_distance
L = 160
offsets = np.arange(L)[None, :] - np.arange(L)[:, None]  # key - query


def bucket(relative: np.ndarray, bidirectional: bool) -> np.ndarray:
    return np.asarray(relative_position_bucket(jnp.asarray(relative), bidirectional=bidirectional,
                                               num_buckets=num_buckets, max_distance=max_distance))


fig, axes = plt.subplots(1, 3, figsize=(17, 5), gridspec_kw={"width_ratios": [1, 1, 1.4]})
for ax, bidirectional in zip(axes[:2], (True, False), strict=True):
    image = np.ma.masked_where((offsets > 0) & (not bidirectional), bucket(offsets, bidirectional))
    shown = ax.imshow(image, cmap="viridis", interpolation="nearest")
    ax.set_facecolor("white")
    ax.set_title(f"{'bidirectional (encoder)' if bidirectional else 'causal (decoder)'}: bucket")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    fig.colorbar(shown, ax=ax, fraction=0.046)
rel = np.arange(-L + 1, L)
for bidirectional, style, name in ((True, "-", "bidirectional"), (False, "--", "causal")):
    axes[2].plot(rel, bucket(rel, bidirectional), style, label=name)
for x in (-max_distance, max_distance):
    axes[2].axvline(x, color="grey", linewidth=0.8, linestyle=":")
axes[2].set_xlabel("relative position (key - query)")
axes[2].set_ylabel("bucket")
axes[2].set_title(f"{num_buckets} buckets, exact near 0, log-spaced to ±{max_distance}")
axes[2].legend(loc="center right")
fig.tight_layout()
plt.show()

# %% [markdown]
# **RoPE as clock hands.** Rotary embeddings rotate each pair of query/key dimensions
# `(i, i + d/2)` by the angle `position × θ_i`, with `θ_i = base^(-2i/d)`. Each pair is a clock
# hand turning at its own speed: the fast pairs (small `i`) spin once every few tokens and
# resolve nearby order, the slow ones barely move over a whole context, so they carry content
# that is almost position-free. Below, a unit vector is put in every pair and rotated by the
# model's own `apply_rope` (head_dim 64, base 10,000) for positions 0-31; the hand of position
# `p` is drawn with length growing with `p` (grey: the path of the tips). The last panel gives
# each pair's wavelength `2π / θ_i` in tokens against the context length.

# %%
from t5x_like.models.layers import apply_rope, rope_frequencies

rope = TransformerConfig(position_encoding="rope", head_dim=64, rope_base=10_000.0)
d, positions = rope.head_dim, np.arange(32)
inv_freq, _ = rope_frequencies(rope)
unit = np.zeros((1, len(positions), 1, d), np.float32)
unit[..., : d // 2] = 1.0  # every pair starts as the vector (1, 0)
rotated = np.asarray(apply_rope(jnp.asarray(unit), jnp.asarray(positions)[None], rope))[0, :, 0]
angles = np.arctan2(rotated[:, d // 2:], rotated[:, : d // 2])  # [position, pair]
expected = np.angle(np.exp(1j * positions[:, None] * inv_freq[None, :]))
assert np.allclose(angles, expected, atol=1e-4), "apply_rope disagrees with rope_frequencies"

PAIRS_SHOWN = {"fast": 0, "medium": 8, "slow": 16, "slowest": d // 2 - 1}
fig = plt.figure(figsize=(19, 5.4), layout="constrained")
grid = fig.add_gridspec(1, len(PAIRS_SHOWN) + 1, width_ratios=[1] * len(PAIRS_SHOWN) + [1.3])
norm = plt.Normalize(0, positions[-1])
radius = 0.25 + 0.75 * positions / positions[-1]  # hand length grows with the position
clocks = []
for k, (speed, i) in enumerate(PAIRS_SHOWN.items()):
    ax = fig.add_subplot(grid[0, k], projection="polar")
    clocks.append(ax)
    ax.plot(angles[:, i], radius, color="#bbbbbb", linewidth=0.8)  # path of the hand tips
    for p in positions:
        ax.plot([0, angles[p, i]], [0, radius[p]], color=plt.cm.viridis(norm(p)), linewidth=1.4)
    for p in ((1, 2, 3) if inv_freq[i] > 0.2 else ()) + (positions[-1],):
        ax.annotate(str(p), (angles[p, i], radius[p]), fontsize=8, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_yticks([])
    ax.set_ylim(0, 1.08)
    ax.set_thetagrids([0, 90, 180, 270], [])
    turns = positions[-1] * inv_freq[i] / (2 * np.pi)
    ax.set_title(f"{speed}: pair {i}, θ = {inv_freq[i]:.3g} rad/token\n"
                 f"{turns:.3g} turns in {positions[-1]} tokens", fontsize=10)
fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap="viridis"), ax=clocks, location="bottom",
             shrink=0.5, label="position of the hand")
ax = fig.add_subplot(grid[0, -1])
ax.semilogy(np.arange(d // 2), 2 * np.pi / inv_freq, "o-", markersize=3)
for length, name in ((positions[-1] + 1, "positions shown"), (2048, "2,048-token context")):
    ax.axhline(length, color="grey", linestyle=":", linewidth=0.8)
    ax.text(0, length * 1.3, name, fontsize=8)
for speed, i in PAIRS_SHOWN.items():
    ax.annotate(speed, (i, 2 * np.pi / inv_freq[i]), fontsize=8, xytext=(5, -10),
                textcoords="offset points")
ax.set_xlabel("pair i (dimensions i and i + d/2)")
ax.set_ylabel("wavelength 2π/θ_i (tokens)")
ax.set_title("one turn of each pair's hand, in tokens")
plt.show()

# %% [markdown]
# ## 4. Train two tiny models and decode
#
# Both runs go through the real trainer (`t5x_like.train.trainer.train`, configured by gin
# exactly like `python -m t5x_like.train`): the tiny T5 v1.1-style encoder-decoder of
# `gin/runs/quickstart.gin` (3.3M parameters) on span corruption, and its parameter-matched
# decoder-only partner `gin/models/tiny_decoder_only.gin` (3.1M) on full-sequence LM
# (`gin/objectives/full_lm.gin`), each seeing the same number of tokens per example. The loss
# curves are read back from each model directory's `metrics.jsonl` (lines: train every few
# steps, dots: validation). The two losses measure different tasks and are not comparable
# number for number: the span-corruption loss covers only the short targets (about a quarter
# of them sentinels, which are easy), the decoder-only loss every token of the sequence.
# Model directories go to `$T5X_LIKE_NOTEBOOK_WORKDIR` (default: a new temporary directory).

# %%
import json
import tempfile

import gin

from t5x_like import gin_utils
from t5x_like.train import trainer

WORKDIR = Path(os.environ.get("T5X_LIKE_NOTEBOOK_WORKDIR") or tempfile.mkdtemp(prefix="nb_"))
STEPS = 20 if SMALL else 300
BATCH = 8 if SMALL else 32
ENC_DEC_LENGTHS = {"inputs": 64, "targets": 16} if SMALL else {"inputs": 128, "targets": 32}
LM_LENGTHS = {"targets": sum(ENC_DEC_LENGTHS.values())}
COMMON = [f"train.num_train_steps = {STEPS}", f"train.batch_size = {BATCH}",
          f"train.log_every = {max(1, STEPS // 30)}", f"train.checkpoint_every = {STEPS}",
          f"train.eval_every = {STEPS if SMALL else 100}", "train.eval_steps = 2"]
RUNS = {
    "enc_dec_span_corruption": (["gin/runs/quickstart.gin"], ENC_DEC_LENGTHS),
    "decoder_only_clm": (["gin/runs/quickstart.gin", "gin/models/tiny_decoder_only.gin",
                          "gin/objectives/full_lm.gin"], LM_LENGTHS),
}


def train_run(name: str, gin_files: list[str], lengths: dict[str, int]) -> Path:
    """Train one model with gin (as the CLI would) in WORKDIR/name; returns the model dir."""
    model_dir = WORKDIR / name
    gin.clear_config()
    gin_utils.parse_gin([str(REPO_ROOT / f) for f in gin_files],
                  [*COMMON, f"TASK_FEATURE_LENGTHS = {lengths}"])
    trainer.train(model_dir=str(model_dir))
    gin.clear_config()
    return model_dir


model_dirs = {name: train_run(name, files, lengths) for name, (files, lengths) in RUNS.items()}

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
for (name, model_dir), colour in zip(model_dirs.items(), ("#4e79a7", "#e15759"), strict=True):
    lines = (model_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    for split, style in (("train", "-"), ("eval", "o")):
        points = [r for r in rows if r["split"] == split]
        for ax, key in zip(axes, ("loss", "accuracy"), strict=True):
            ax.plot([r["step"] for r in points], [r[key] for r in points], style, color=colour,
                    label=f"{name} ({split})")
for ax, key in zip(axes, ("loss (cross-entropy + z-loss)", "token accuracy"), strict=True):
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
axes[0].axhline(np.log(8192), color="grey", linestyle=":", linewidth=0.8)
axes[0].text(0, np.log(8192) + 0.1, "uniform over 8,192 ids", fontsize=8)
axes[1].legend(fontsize=8)
fig.suptitle(f"{STEPS} steps, batch {BATCH}, {sum(ENC_DEC_LENGTHS.values())} tokens per example")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Decoding.** `t5x_like.infer.load_predictor` rebuilds each model from its model directory
# (`config.gin`) and restores the latest checkpoint. The span-corruption model is decoded on
# token ids with `t5x_like.models.decoding.decode` (greedy; KV cache, one `jax.lax.while_loop`),
# so sentinels stay exact: it writes `<extra_id_0> span <extra_id_1> span ...`, and below its
# spans are put back in place of the sentinels, next to the true ones. The decoder-only model
# continues text prompts (the first 16 tokens of validation documents) through
# `infer.predict`, text in, text out. After a few hundred steps on 2 CPU cores expect frequent
# words and loops rather than sense; the point is the machinery, which is the same at any scale.

# %%
from t5x_like import infer
from t5x_like.models.decoding import decode
from t5x_like.train.partitioning import partitioning_context


def spans(ids: list[int]) -> dict[int, list[int]]:
    """Targets `<extra_id_k> tokens ...` -> {k: tokens}; stops at EOS."""
    out, current = {}, None
    for i in ids:
        if i == vocab.eos_id:
            break
        if i >= FIRST_SENTINEL:
            current = vocab.vocab_size - 1 - i
            out[current] = []
        elif current is not None:
            out[current].append(i)
    return out


def space_before(ids: list[int]) -> str:
    """" " when the run starts a new word (SentencePiece's decode drops that space)."""
    starts_word = bool(ids) and vocab.tokenizer.id_to_piece(int(ids[0])).startswith("\u2581")
    return " " if starts_word else ""


def fill_in(inputs: list[int], filled: dict[int, list[int]]) -> str:
    """The inputs with each sentinel replaced by its span in [[ ]] ([[??]]: none or empty)."""
    text, run = [], []
    for i in [*inputs, None]:
        if i is None or i >= FIRST_SENTINEL or i == vocab.eos_id:
            text.append(space_before(run) + vocab.decode(run))
            run = []
            if i is not None and i >= FIRST_SENTINEL:
                k = vocab.vocab_size - 1 - i
                span = filled.get(k)
                text.append(f"{space_before(span)}[[{vocab.decode(span)}]]" if span else " [[??]]")
        else:
            run.append(i)
    return "".join(text).strip()


span_model = infer.load_predictor(str(model_dirs["enc_dec_span_corruption"]))  # latest step
DOCUMENTS = (1, 2, 4)  # validation documents (0 is the paragraph of part 1)
cases = [preview.preview_task("c4like_span_corruption", vocabulary=VOCABULARY, num_examples=1,
                                   sequence_length=ENC_DEC_LENGTHS, document=doc)[0]
         for doc in DOCUMENTS]
width = ENC_DEC_LENGTHS["inputs"]
encoder_inputs = np.asarray([c.inputs + [0] * (width - len(c.inputs)) for c in cases], np.int32)
with partitioning_context(span_model.mesh, span_model.rules):  # token ids in, token ids out
    out = decode(span_model.model, span_model.params, {"encoder_input_tokens": encoder_inputs},
                 method="greedy", max_decode_length=ENC_DEC_LENGTHS["targets"])
for case, tokens in zip(cases, np.asarray(out["tokens"])[:, 0], strict=True):
    print("model:", fill_in(case.inputs, spans(tokens.tolist())))
    print("truth:", fill_in(case.inputs, spans(case.targets)), end="\n\n")

# %%
lm_model = infer.load_predictor(str(model_dirs["decoder_only_clm"]))
prompts = [vocab.decode(preview.preview_task("c4like_full_lm", vocabulary=VOCABULARY,
                                                  num_examples=1, document=doc)[0].chunk[:16])
           for doc in DOCUMENTS]  # the first 16 tokens of each document, as text
for result in infer.predict(lm_model, prompts, method="greedy", max_decode_length=24):
    print(f"{result['input']} >>> {result['output']}")
gin.clear_config()  # load_predictor leaves the model's gin config parsed

# %% [markdown]
# ## 5. The T5 tables at tiny scale
#
# `python -m t5x_like.sweep` re-runs rows of the paper's tables (Table 2 architectures,
# Tables 3-6 objectives, corruption rates, span lengths) at a scale that fits a small machine,
# pre-training each row and fine-tuning it on the offline downstream suite; the committed tiny
# run is `benchmarks/t5_tables_tiny.json` (set `T5X_LIKE_SWEEP_RESULTS` to read another).
# Absolute numbers cannot match the paper (tiny models, a 20 MB corpus, other downstream
# tasks), so each panel plots ours against the paper's row by row: what should carry over is the
# *ranking* of the rows, measured by Kendall's τ (1 = same order, -1 = reversed). Error bars are
# the standard deviation over seeds.

# %%
SWEEP_RESULTS = Path(os.environ.get("T5X_LIKE_SWEEP_RESULTS")
                     or REPO_ROOT / "benchmarks" / "t5_tables_tiny.json")
if not SWEEP_RESULTS.exists():
    raise FileNotFoundError(f"sweep results {SWEEP_RESULTS} not found: run the tiny sweep "
                            "(python -m t5x_like.sweep, see docs/experiments.md) or point "
                            "T5X_LIKE_SWEEP_RESULTS at a results JSON")
from t5x_like.sweep.paper import COMPARE_COLUMN  # the paper column Kendall's τ is computed on

sweep = json.loads(SWEEP_RESULTS.read_text(encoding="utf-8"))
tables = sweep["tables"]
columns = min(3, len(tables))
fig, axes = plt.subplots(-(-len(tables) // columns), columns, squeeze=False,
                         figsize=(6.5 * columns, 5 * -(-len(tables) // columns)))
for ax, (table_id, table) in zip(axes.flat, tables.items(), strict=False):
    tau, p_value = table.get("kendall_tau"), table.get("kendall_p_value")
    tau_text = "n/a" if tau is None else f"{tau:.2f}" + (
        "" if p_value is None else f" (p = {p_value:.2f})")
    print(f"{table_id}: {table['title']}; Kendall tau {tau_text}")
    for row in table["rows"]:
        paper = (row.get("paper") or {}).get(COMPARE_COLUMN)
        ours, std = row["ours_mean"], row.get("ours_std") or 0.0
        print(f"  {row['row']:<34} ours {'-' if ours is None else f'{ours:6.2f} ± {std:.2f}'} "
              f"({row['num_seeds']} seeds)   paper {'-' if paper is None else f'{paper:.2f}'}")
        if paper is not None and ours is not None:
            ax.errorbar(paper, ours, yerr=std, fmt="o", capsize=3)
            ax.annotate(row["row"], (paper, ours), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
    ax.set_title(f"{table['title']}\nKendall τ = {tau_text}", fontsize=10)
    ax.set_xlabel(f"paper: {COMPARE_COLUMN}")
    ax.set_ylabel(f"ours: {table['metric'].split(':')[0]}")
    ax.margins(x=0.3, y=0.15)  # room for the row labels
    ax.grid(alpha=0.3)
for ax in list(axes.flat)[len(tables):]:
    ax.set_visible(False)
print("ours:", next(iter(tables.values()))["metric"])
fig.suptitle(f"T5 tables, ours at scale {sweep['scale']!r} vs the paper ({SWEEP_RESULTS.name})")
fig.tight_layout()
plt.show()
