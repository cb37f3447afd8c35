"""`t5x_like.infer`: predictor loading, predict/score vs the model API, sharded decoding, CLI."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gin
import jax
import numpy as np
import pytest

from t5x_like import families, infer
from t5x_like.models import decoding
from tests.conftest import REPO, TINY_BINDINGS

TEXTS = ["The cat sat on the <extra_id_0> and then it ran away.", "Hello world",
         "A third, somewhat longer input about the history of the State of the Union."]


@pytest.fixture(scope="module")
def predictor(pretrained_dir: str) -> infer.Predictor:
    return infer.load_predictor(pretrained_dir)


def host(tree):
    """Params as host numpy arrays: decoding them runs on one device."""
    return jax.tree.map(np.asarray, tree)


def encoder_batch(pred: infer.Predictor, texts: list[str]) -> dict:
    li = pred.input_length
    rows = np.zeros((len(texts), li), np.int32)
    for i, t in enumerate(texts):
        ids = [*pred.vocabulary.encode(t)][: li - 1] + [1]
        rows[i, : len(ids)] = ids
    return {"encoder_input_tokens": rows}


def text_of(pred: infer.Predictor, tokens: np.ndarray) -> str:
    ids = [int(t) for t in tokens]
    ids = ids[: ids.index(1)] if 1 in ids else ids
    return pred.vocabulary.decode([i for i in ids if i])


def test_load_predictor_reads_config_and_latest_step(predictor, pretrained_dir):
    assert predictor.step == 20 and predictor.family == "encoder_decoder"
    assert predictor.sequence_length == {"inputs": 64, "targets": 16}
    assert predictor.vocabulary_name == "c4like_8k" and predictor.model.config.emb_dim == 32
    by_step_dir = infer.load_predictor(f"{pretrained_dir}/checkpoints/20")
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), host(predictor.params),
                        host(by_step_dir.params))
    assert all(jax.tree.leaves(same))


@pytest.mark.parametrize("method,options", [("greedy", {}), ("beam", {"num_decodes": 2})])
def test_predict_reproduces_decode(predictor, method, options):
    preds = infer.predict(predictor, TEXTS, method=method, batch_size=8, **options)
    kwargs = {"num_beams": 4, "num_decodes": 2} if method == "beam" else {}
    direct = decoding.decode(predictor.model, host(predictor.params),
                             encoder_batch(predictor, TEXTS), method=method,
                             max_decode_length=16, **kwargs)
    for i, p in enumerate(preds):
        assert p["input"] == TEXTS[i]
        assert p["output"] == text_of(predictor, np.asarray(direct["tokens"])[i, 0])
        assert p["score"] == pytest.approx(float(direct["scores"][i, 0]), abs=1e-4)
        if method == "beam":
            assert len(p["outputs"]) == 2 and p["scores"][0] >= p["scores"][1]


@pytest.mark.parametrize("mesh_shape,preset", [((1, 8, 1), "fsdp"),
                                               ((2, 1, 4), "tensor_parallel")])
def test_sharded_predictor_decodes_like_single_device(pretrained_dir, predictor, mesh_shape,
                                                      preset):
    sharded = infer.load_predictor(pretrained_dir, mesh_shape=mesh_shape, partitioning=preset)
    specs = [leaf.sharding.spec for leaf in jax.tree.leaves(sharded.params)]
    assert any(any(axis is not None for axis in spec) for spec in specs)  # really sharded
    single = decoding.decode(predictor.model, host(predictor.params),
                             encoder_batch(predictor, TEXTS), max_decode_length=16)
    outputs = [p["output"] for p in infer.predict(sharded, TEXTS, batch_size=8)]
    assert outputs == [text_of(predictor, t[0]) for t in np.asarray(single["tokens"])]


def test_forced_decoder_prompt(predictor):
    prompts = ["the", "spam or"]
    preds = infer.predict(predictor, TEXTS[:2], decoder_prompts=prompts, batch_size=8)
    batch = encoder_batch(predictor, TEXTS[:2])
    forced = [[0, *predictor.vocabulary.encode(p)] for p in prompts]
    batch["decoder_input_tokens"] = np.zeros((2, max(map(len, forced))), np.int32)
    for i, f in enumerate(forced):
        batch["decoder_input_tokens"][i, : len(f)] = f
    batch["prompt_lengths"] = np.asarray([len(f) for f in forced], np.int32)
    direct = decoding.decode(predictor.model, host(predictor.params), batch,
                             max_decode_length=16)
    for i, p in enumerate(preds):
        assert p["output"] == text_of(predictor, np.asarray(direct["tokens"])[i, 0])
        assert p["score"] == pytest.approx(float(direct["scores"][i, 0]), abs=1e-4)


def test_score_matches_model_score(predictor):
    targets_text = ["the cat", "spam", "a somewhat longer target sentence"]
    scores = infer.score(predictor, TEXTS, targets_text, batch_size=2)
    batch = encoder_batch(predictor, TEXTS)
    targets = np.zeros((3, 16), np.int32)
    for i, t in enumerate(targets_text):
        ids = [*predictor.vocabulary.encode(t)][:15] + [1]
        targets[i, : len(ids)] = ids
    batch.update(decoder_target_tokens=targets,
                 decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))))
    expected = np.asarray(jax.jit(predictor.model.score)(host(predictor.params), batch))
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    assert all(s < 0 for s in scores)


def test_rank_equals_score_of_every_pair(predictor):
    labels = ["ham", "spam", "a much longer label"]
    ranked = infer.rank(predictor, TEXTS, labels, batch_size=2)  # 2 batches, one padded
    assert ranked.shape == (3, 3)
    pairs = infer.score(predictor, [t for t in TEXTS for _ in labels], labels * len(TEXTS))
    np.testing.assert_allclose(ranked.ravel(), pairs, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="at least one candidate"):
        infer.rank(predictor, TEXTS, [])


def test_cli_txt_and_jsonl(tmp_path, pretrained_dir, predictor, caplog):
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(TEXTS[:2]) + "\n\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert infer.main([f"--checkpoint={pretrained_dir}", f"--input_file={txt}",
                       f"--output_file={out}", "--batch_size=8"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    expected = infer.predict(predictor, TEXTS[:2], batch_size=8)
    assert [r["inputs"] for r in rows] == TEXTS[:2]
    assert [r["output"] for r in rows] == [p["output"] for p in expected]
    # A healthy checkpoint loads without orbax's item-level "Metadata file does not exist".
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(json.dumps({"inputs": TEXTS[0], "targets": "cat"}) + "\n"
                     + json.dumps({"inputs": TEXTS[1]}) + "\n", encoding="utf-8")
    assert infer.main([f"--checkpoint={pretrained_dir}", f"--input_file={jsonl}",
                       f"--output_file={out}", "--method=beam", "--num_decodes=2",
                       "--batch_size=8"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[0]["targets"] == "cat" and "target_score" not in rows[1]
    assert rows[0]["target_score"] == pytest.approx(
        infer.score(predictor, [TEXTS[0]], ["cat"])[0], abs=1e-4)
    assert len(rows[1]["outputs"]) == 2


def test_cli_task_split(tmp_path, pretrained_dir):
    out = tmp_path / "task.jsonl"
    assert infer.main([f"--checkpoint={pretrained_dir}", "--task=downstream_spam",
                       "--split=validation", "--num_examples=3", f"--output_file={out}"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 3 and all(r["targets"] in ("spam", "ham") for r in rows)


def test_cli_errors(tmp_path, pretrained_dir, capsys):
    out = f"--output_file={tmp_path / 'o.jsonl'}"
    good = tmp_path / "ok.txt"
    good.write_text("hi\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    binary = tmp_path / "bad.txt"
    binary.write_bytes(b"abc\xffdef\n")
    cases = [
        ([f"--checkpoint={tmp_path / 'missing'}", f"--input_file={good}"], "not found"),
        ([f"--checkpoint={tmp_path}", f"--input_file={good}"], "no config.gin"),
        ([f"--checkpoint={pretrained_dir}", f"--input_file={empty}"], "is empty"),
        ([f"--checkpoint={pretrained_dir}", f"--input_file={binary}"], "byte offset 3"),
        ([f"--checkpoint={pretrained_dir}", "--task=downstream_spamm"], "downstream_spam"),
        ([f"--checkpoint={pretrained_dir}", f"--input_file={good}", "--gin.nope.x=1"],
         "invalid gin config"),
    ]
    for argv, message in cases:
        assert infer.main([*argv, out]) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_read_inputs_decides_json_by_content_and_extension(tmp_path):
    pairs = [{"inputs": "a b", "targets": "c"}, {"inputs": "d"}]
    lines = "\n".join(json.dumps(p) for p in pairs) + "\n"
    for name in ("x.jsonl", "x.json"):  # JSON lines under either JSON name
        (tmp_path / name).write_text(lines, encoding="utf-8")
        assert infer.read_inputs(str(tmp_path / name)) == pairs
    (tmp_path / "arr.json").write_text(json.dumps(pairs), encoding="utf-8")
    assert infer.read_inputs(str(tmp_path / "arr.json")) == pairs
    (tmp_path / "x.txt").write_text(lines, encoding="utf-8")  # JSON in a text file: refused
    with pytest.raises(infer.InferenceError, match="name it .jsonl"):
        infer.read_inputs(str(tmp_path / "x.txt"))
    (tmp_path / "bad.json").write_text('[{"inputs": 3}]', encoding="utf-8")
    with pytest.raises(infer.InferenceError, match="item 1: expected an object"):
        infer.read_inputs(str(tmp_path / "bad.json"))
    (tmp_path / "braces.txt").write_text("{not json} is fine as text\n", encoding="utf-8")
    assert infer.read_inputs(str(tmp_path / "braces.txt")) == [
        {"inputs": "{not json} is fine as text"}]


def test_unwritable_output_file_fails_before_decoding(tmp_path, capsys):
    good = tmp_path / "ok.txt"
    good.write_text("hi\n", encoding="utf-8")
    # (Permission bits do not stop root, who runs CI: a path under a regular file cannot be made.)
    for out, message in ((good / "sub" / "o.jsonl", "cannot write to"),
                         (tmp_path, "is a directory")):
        # A checkpoint that does not exist: the output check must come first.
        argv = [f"--checkpoint={tmp_path / 'missing'}", f"--input_file={good}",
                f"--output_file={out}"]
        assert infer.main(argv) == 2
        assert message in capsys.readouterr().err


def test_converted_hf_checkpoint_is_usable_directly(tmp_path):
    """`convert --from hf --to ours` output: infer loads it (params, config, the checkpoint's own
    SentencePiece model) and scores exactly as the Hugging Face model does."""
    import shutil

    import torch
    import transformers

    from t5x_like.convert import cli as convert
    from t5x_like.data import vocab
    from t5x_like.train.checkpoints import load_params

    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=8192, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=2, dropout_rate=0.0, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False)).eval()
    hf_dir, out = tmp_path / "hf", tmp_path / "ours"
    hf.save_pretrained(hf_dir)
    shutil.copy(vocab.vocabulary_path("c4like_8k"), hf_dir / "spiece.model")
    assert convert.main(["--from", "hf", "--to", "ours", "--input", str(hf_dir), "--output",
                         str(out), "--gin.TransformerConfig.dtype='float32'"]) == 0
    assert (out / "spiece.model").read_bytes() == (hf_dir / "spiece.model").read_bytes()

    pred = infer.load_predictor(str(out))
    assert pred.step is None and pred.vocabulary.vocab_size == 8100  # 8000 pieces + 100 ids
    # evaluate / fine-tuning initialise from the same dir (train.init_params_path=OUT).
    again = load_params(str(out), jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                               pred.params))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again),
                                                    jax.tree.leaves(pred.params), strict=True))
    target = "on the mat"
    ids_in = [*pred.vocabulary.encode(TEXTS[0]), 1]
    ids_tg = [*pred.vocabulary.encode(target), 1]
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([ids_in]),
                    decoder_input_ids=torch.tensor([[0, *ids_tg[:-1]]])).logits  # T5: 0 starts
    want = torch.log_softmax(logits[0], -1)[torch.arange(len(ids_tg)), torch.tensor(ids_tg)]
    assert infer.score(pred, [TEXTS[0]], [target])[0] == pytest.approx(float(want.sum()),
                                                                       abs=1e-3)
    src, dst = tmp_path / "in.txt", tmp_path / "out.jsonl"
    src.write_text(TEXTS[1] + "\n", encoding="utf-8")
    assert infer.main([f"--checkpoint={out}", f"--input_file={src}", f"--output_file={dst}",
                       "--max_decode_length=4"]) == 0
    assert len(dst.read_text(encoding="utf-8").splitlines()) == 1
    assert infer.main([f"--checkpoint={out}", "--step=3", f"--input_file={src}",
                       f"--output_file={dst}"]) == 2


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module args...` from the repository root, as a user runs it."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def run_clis(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda c: run_cli(*c), commands))


def test_converted_hf_checkpoint_needs_a_vocabulary_that_fits(tmp_path):
    """Issue 39: an HF checkpoint without `spiece.model` converted to a config naming no
    vocabulary, and infer read an 8,192-row embedding with c4_32k's 32,100 ids ('' and NaN,
    exit 0). Now convert needs --vocabulary, and convert and infer refuse one that does not fit."""
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=8192, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=2, dropout_rate=0.0, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False)).save_pretrained(tmp_path / "hf")  # no spiece.model
    out = tmp_path / "ours"

    def convert(output, *flags):
        return ("t5x_like.convert", "--from", "hf", "--to", "ours", "--input",
                str(tmp_path / "hf"), "--output", str(output), *flags)

    unnamed, too_big = run_clis(convert(out), convert(out, "--vocabulary=c4_32k"))
    for proc in (unnamed, too_big):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "no spiece.model" in unnamed.stderr and "--vocabulary=" in unnamed.stderr
    assert "32100 ids" in too_big.stderr and "8192 rows" in too_big.stderr, too_big.stderr
    assert not out.exists()

    bare = tmp_path / "bare"  # --vocabulary=none: allowed, but infer then asks for one
    for proc in run_clis(convert(out, "--vocabulary=c4like_8k"),
                         convert(bare, "--vocabulary=none")):
        assert proc.returncode == 0, proc.stderr
    assert "train.vocabulary = 'c4like_8k'" in (out / "config.gin").read_text()
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"inputs": TEXTS[0], "targets": "on the mat"}) + "\n")
    infer_cli = ("t5x_like.infer", f"--checkpoint={out}", f"--input_file={src}",
                 f"--output_file={dst}", "--max_decode_length=4")
    good, forced, unnamed = run_clis(infer_cli, (*infer_cli, "--gin.train.vocabulary='c4_32k'"),
                                     (*infer_cli[:1], f"--checkpoint={bare}", *infer_cli[2:]))
    assert good.returncode == 0, good.stderr
    row = json.loads(dst.read_text())
    assert math.isfinite(row["score"]) and math.isfinite(row["target_score"])
    assert forced.returncode == 2 and "Traceback" not in forced.stderr, forced.stderr
    assert "'c4_32k' has 32100 ids" in forced.stderr and "8192 rows" in forced.stderr
    assert unnamed.returncode == 2 and "binds no train.vocabulary" in unnamed.stderr


def test_cli_refuses_bad_numbers_before_loading_anything(tmp_path):
    """Issue 39: numeric flags are range-checked by argparse: exit 2 naming the flag, no
    traceback, before the (here missing) checkpoint is even looked at."""
    base = ("t5x_like.infer", f"--checkpoint={tmp_path / 'missing'}",
            f"--input_file={tmp_path / 'missing.txt'}", f"--output_file={tmp_path / 'o.jsonl'}")
    cases = {
        "--temperature=-1": "argument --temperature: must be a number >= 0, got '-1'",
        "--max_decode_length=0": "argument --max_decode_length: must be an integer >= 1",
        "--top_p=1.5": "argument --top_p: must be a number in (0, 1]",
        "--batch_size=nan": "argument --batch_size: must be an integer >= 1",
        "--num_decodes=2": "--num_decodes=2 needs --method=sample or beam",
    }
    procs = run_clis(*((*base, flag) for flag in cases),
                     (*base, "--method=greedy", "--temperature=0.5"))
    for proc, message in zip(procs, [*cases.values(), "--temperature does not apply to "
                                     "--method=greedy"], strict=True):
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "not found" not in proc.stderr


def test_cli_warns_once_about_truncation(tmp_path, pretrained_dir):
    """A truncated input that is decoded and scored: one warning, from logger t5x_like.infer
    (was: twice, from `__main__`)."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"inputs": " ".join([TEXTS[2]] * 8), "targets": "x"}) + "\n"
                   + json.dumps({"inputs": TEXTS[1]}) + "\n")
    proc = run_cli("t5x_like.infer", f"--checkpoint={pretrained_dir}", f"--input_file={src}",
                   f"--output_file={tmp_path / 'o.jsonl'}", "--max_decode_length=2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("truncated") == 1, proc.stderr
    assert "t5x_like.infer" in proc.stderr and "__main__" not in proc.stderr
    assert "1 of 2 inputs truncated to the model's input length 64 tokens" in proc.stderr


# Every family through the real CLI --------------------------------------------------------------
def pretrain_tiny(model_dir: Path, family: str) -> str:
    """`python -m t5x_like.train` (in-process) of conftest's tiny model as a `family` model: 20
    span-corruption steps (the decoder-only families read inputs + targets as one sequence)."""
    from t5x_like.train.cli import main

    argv = ["--gin_file", str(REPO / "gin/runs/quickstart.gin"), f"--model_dir={model_dir}"]
    for b in (*TINY_BINDINGS, f"TransformerConfig.family = '{family}'"):
        argv += ["--gin_bindings", b]
    gin.clear_config()
    assert main(argv) == 0
    gin.clear_config()
    return str(model_dir)


@pytest.fixture(scope="module", params=families.NAMES)
def family_dir(request, tmp_path_factory, pretrained_dir) -> tuple[str, str]:
    """(family, a tiny trained model dir of it); the encoder-decoder is conftest's."""
    family = request.param
    if family == families.ENCODER_DECODER.name:
        return family, pretrained_dir
    return family, pretrain_tiny(tmp_path_factory.mktemp(family) / "model", family)


LABELS = ["ham", "spam", "a much longer label"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_cli_greedy_beam_score_and_rank_on_every_family(tmp_path, family_dir):
    """`python -m t5x_like.infer` (greedy and beam, scoring every input x label pair) on a tiny
    checkpoint of each family: the same outputs and scores as the library, finite scores, and
    rank classification (`infer.rank`: one prefill per input) consistent with those scores."""
    family, model_dir = family_dir
    src = tmp_path / "pairs.jsonl"
    pairs = [(text, label) for text in TEXTS for label in LABELS]
    src.write_text("".join(json.dumps({"inputs": t, "targets": lab}) + "\n" for t, lab in pairs),
                   encoding="utf-8")
    base = ("t5x_like.infer", f"--checkpoint={model_dir}", f"--input_file={src}",
            "--max_decode_length=6", "--batch_size=4")
    greedy, beam = tmp_path / "greedy.jsonl", tmp_path / "beam.jsonl"
    procs = run_clis((*base, f"--output_file={greedy}"),
                     (*base, f"--output_file={beam}", "--method=beam", "--num_decodes=2"))
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
    greedy_rows, beam_rows = read_jsonl(greedy), read_jsonl(beam)
    assert [(r["inputs"], r["targets"]) for r in greedy_rows] == pairs

    predictor = infer.load_predictor(model_dir)
    assert predictor.family == family and predictor.has_inputs
    lib = infer.predict(predictor, [t for t, _ in pairs], max_decode_length=6, batch_size=4)
    assert [r["output"] for r in greedy_rows] == [p["output"] for p in lib]
    np.testing.assert_allclose([r["score"] for r in greedy_rows], [p["score"] for p in lib],
                               atol=1e-4)
    lib_beam = infer.predict(predictor, TEXTS, method="beam", num_decodes=2, max_decode_length=6)
    for row, p in zip(beam_rows[::len(LABELS)], lib_beam, strict=True):
        assert row["outputs"] == p["outputs"] and row["output"] == p["outputs"][0]
        np.testing.assert_allclose(row["scores"], p["scores"], atol=1e-4)
        assert row["scores"][0] >= row["scores"][1]  # best first
    scores = np.asarray([r["target_score"] for r in greedy_rows])
    assert np.all(np.isfinite(scores)) and np.all(scores < 0)
    assert [r["target_score"] for r in beam_rows] == list(scores)  # scoring ignores decoding
    assert all(math.isfinite(s) for r in beam_rows for s in r["scores"])

    ranked = infer.rank(predictor, TEXTS, LABELS, batch_size=2)
    np.testing.assert_allclose(ranked.ravel(), scores, rtol=1e-4, atol=1e-4)
    assert list(ranked.argmax(1)) == list(scores.reshape(len(TEXTS), -1).argmax(1))


def test_decodes_stop_at_max_decode_length_and_eos_on_every_family(family_dir):
    """`model.decode` on the model's own prompt batch: at most `max_decode_length` tokens, the
    lengths count up to and including EOS, nothing after it; greedy equals `predict`."""
    predictor = infer.load_predictor(family_dir[1])
    batch = infer._prompt_batch(predictor, TEXTS, None)  # noqa: SLF001
    for method, options in (("greedy", {}), ("beam", {"num_beams": 3, "num_decodes": 2})):
        out = decoding.decode(predictor.model, host(predictor.params), batch, method=method,
                              max_decode_length=5, **options)
        tokens, lengths = np.asarray(out["tokens"]), np.asarray(out["lengths"])
        assert tokens.shape[:2] == (len(TEXTS), options.get("num_decodes", 1))
        assert tokens.shape[2] == 5 and np.all((lengths >= 1) & (lengths <= 5))
        for seq, n in zip(tokens.reshape(-1, 5), lengths.ravel(), strict=True):
            assert not seq[n:].any()
            assert n == 5 or seq[n - 1] == 1  # stopped at EOS
        if method == "greedy":
            texts = [p["output"] for p in infer.predict(predictor, TEXTS, max_decode_length=5)]
            assert texts == [text_of(predictor, t[0]) for t in tokens]
