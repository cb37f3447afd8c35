"""The gin presets: every file parses, sizes match their documented counts, and the Table 2
rows keep the paper's parameter (P / 2P) and cost (M / M/2) bookkeeping."""

import pathlib
import re
import subprocess
import sys

import gin
import pytest

from t5x_like.models import TransformerConfig, make_model, parameter_count

GIN = pathlib.Path(__file__).resolve().parents[2] / "gin"
MODELS = sorted((GIN / "models").glob("*.gin"))
ARCHITECTURES = sorted((GIN / "architectures").glob("*.gin"))
SCAN = ["TransformerConfig.scan_layers = True"]  # same parameters, traces one layer: fast
gin.add_config_file_search_path(str(GIN.parent))  # presets include gin/models/common/*.gin


def config_from(*files: pathlib.Path, bindings: list[str] = ()) -> TransformerConfig:
    gin.clear_config()
    gin.parse_config_files_and_bindings([str(f) for f in files], list(bindings))
    return TransformerConfig()


def documented_count(path: pathlib.Path) -> float:
    """The first 'N.NNM/B parameters' figure of the file's header comment."""
    match = re.search(r"([\d.]+)([MB]) parameters", path.read_text())
    return float(match.group(1)) * {"M": 1e6, "B": 1e9}[match.group(2)]


def test_all_presets_parse():
    assert len(MODELS) >= 15 and len(ARCHITECTURES) == 5
    for path in MODELS:
        cfg = config_from(path)
        assert cfg.vocab_size % 128 == 0, path.name
        assert cfg.family in ("encoder_decoder", "decoder_only"), path.name
    for path in ARCHITECTURES:
        assert config_from(GIN / "models/tiny.gin", path).emb_dim == 128


@pytest.mark.parametrize(
    "name",
    ["tiny", "tiny_decoder_only", "t5_1_0_small", "t5_1_1_base", "t5_1_0_11b", "decoder_only_base"],
)
def test_preset_parameter_counts_match_their_comments(name):
    path = GIN / "models" / f"{name}.gin"
    count = parameter_count(config_from(path, bindings=SCAN))
    assert count == pytest.approx(documented_count(path), rel=0.005)


def test_tiny_presets_fit_the_small_vocabulary():
    for name in ("tiny", "tiny_decoder_only"):
        cfg = config_from(GIN / "models" / f"{name}.gin")
        assert cfg.vocab_size >= 8100 and cfg.dtype == "float32" and cfg.emb_dim <= 256


def test_table2_parameter_and_cost_bookkeeping():
    """Base-sized rows at 512 input / 114 target tokens: P, 2P, M, M/2 as in the paper."""
    lengths = {"inputs": 512, "targets": 114}
    params, flops = {}, {}
    for path in ARCHITECTURES:
        cfg = config_from(GIN / "models/t5_1_0_base.gin", path, bindings=SCAN)
        params[path.stem] = parameter_count(cfg)
        flops[path.stem] = make_model(cfg).flops_per_sequence(lengths)
    p, m = params["language_model"], flops["encoder_decoder"]
    assert params["encoder_decoder"] / p == pytest.approx(2.0, rel=0.1)  # 2P
    for row in ("enc_dec_shared", "enc_dec_6_layers", "prefix_lm"):
        assert 1.0 <= params[row] / p < 1.3, row  # P (+ cross-attention / embeddings)
    assert flops["enc_dec_shared"] == m  # M
    assert flops["enc_dec_6_layers"] / m == pytest.approx(0.5, abs=0.05)  # M/2
    assert flops["language_model"] == flops["prefix_lm"]
    assert flops["language_model"] / m == pytest.approx(1.0, abs=0.1)  # M
    assert m / 1e9 == pytest.approx(426, rel=0.01)  # docs/performance: ~426 GFLOP (base)


def test_models_import_without_tensorflow():
    code = "import sys, t5x_like.models; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=GIN.parent)
