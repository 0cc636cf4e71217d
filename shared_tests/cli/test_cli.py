"""The console command: what the README and the docs pages promise runs, and prints what it says."""

from __future__ import annotations

from transformer_cli.main import main


def test_compare_prints_the_side_by_side_table(capsys):
    assert main(["compare", "--backends", "numpy", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "held to the NumPy float64 reference" in out and "numpy    float32" in out


def test_train_translates_the_seeds_corpus_after_training(capsys):
    assert main(["train", "--task", "translate", "--backend", "numpy", "--steps", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    translations = [line for line in lines if "->" in line]
    assert len(translations) == 6 and all(line.rstrip().endswith("ok") for line in translations), translations
