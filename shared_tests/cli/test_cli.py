"""The console command: what the README and the docs pages promise runs, and prints what it says."""

from __future__ import annotations

from transformer_cli.main import main
from transformer_spec import Config, init_params, save_params

from ..helpers import assert_compare_rows_within_tolerance


def test_compare_prints_the_side_by_side_table(capsys):
    """The README's main command as typed (``transformer-ref compare``, its defaults: every
    installed backend, both dtypes): a row for each, within its tolerance of the reference."""
    assert main(["compare"]) == 0
    out = capsys.readouterr().out
    assert "held to the NumPy float64 reference" in out, out
    assert_compare_rows_within_tolerance(out)


def test_compile_is_a_note_where_a_backend_has_no_compiler(capsys):
    """--compile serves a run of every backend: NumPy, which has no compiler, runs as it is and
    says so (torch would compile; JAX is always jit-compiled)."""
    assert main(["compare", "--backends", "numpy", "--repeat", "1", "--compile"]) == 0
    out = capsys.readouterr().out
    assert "--compile: numpy has no compiler: it runs as it is" in out and "numpy    float32" in out


def test_train_translates_the_seeds_corpus_after_training(capsys):
    assert main(["train", "--task", "translate", "--backend", "numpy", "--steps", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    translations = [line for line in lines if "->" in line]
    assert len(translations) == 6 and all(line.rstrip().endswith("ok") for line in translations), translations


def test_params_counts_table_3s_models_part_by_part_with_the_shared_table_once(capsys):
    """paper-base and paper-big: Table 3's 65M and 213M, exactly; the one table of the three-way
    sharing shown once, in the embeddings, and said to be shared; the tied output projection 0."""
    for preset, rows in (
        ("paper-base", {"embeddings": 18_944_000, "encoder": 18_914_304, "decoder": 25_224_192, "total": 63_082_496}),
        ("paper-big", {"embeddings": 37_888_000, "encoder": 75_577_344, "decoder": 100_780_032, "total": 214_245_376}),
    ):
        assert main(["params", "--preset", preset]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith(f"preset {preset}: encoder_decoder, 6 + 6 layers")
        counted = {line[:18].strip(): int(line[18:32].replace(",", "")) for line in lines[1:]}
        assert counted == rows | {"output projection": 0}
        assert "one shared 37,000 x" in lines[1] and "source and target embeddings, output projection" in lines[1]
        assert sum(v for k, v in counted.items() if k != "total") == counted["total"]


def test_params_of_a_weights_file_counts_the_arrays_it_holds(capsys, tmp_path):
    """A file's own arrays, part by part: a shared table is stored once, so counted once."""
    config = Config.preset("tiny", src_vocab_size=47, share_embeddings=True)
    params = init_params(config)
    save_params(tmp_path / "shared.safetensors", params, config)
    assert main(["params", "--weights", str(tmp_path / "shared.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "one shared 47 x 36 table: source and target embeddings" in out
    assert f"{'total':<18}{sum(v.size for v in params.values()):>14,}" in out
    assert f"{'embeddings':<18}{47 * 36:>14,}" in out  # sinusoids are not weights
