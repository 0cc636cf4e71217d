"""Mutation testing with hand-made realistic bugs (``tools/mutant_list.py``).

    python -m tools.mutants [--only NAME ...] [--jobs N] [--timeout S] [--json PATH] [--check] [--quick]

For each mutant: copy the repository (``git archive HEAD``, or the working tree with
``--worktree``) into a temporary folder, replace the mutant's snippet (which must occur
exactly once), and run the shared suite there with ``-x -q -p no:cacheprovider``:
killed (a test failed), survived (all passed) or timeout. The copy is imported, never
/work/main: PYTHONPATH puts it first (the editable install's finder comes after sys.path),
and each run checks that. Prints a table and the mutation score; writes JSON results.

What the runs leave out, and why:
  * shared_tests/repository/test_mirror.py: it compares the three backends' source line by line, and
    test_every_difference_has_a_reason fails on any one-backend edit whatever it does (checked:
    a torch-only mutant fails it and nothing else of test_docs.py + test_mirror.py), so it
    would kill every backend mutant and hide the survivors;
  * shared_tests/repository/test_docs.py: the site built from the source (a minute a run) and checked for
    what a reader needs; no parity number in it (those come from the suite below);
  * the oracles (shared_tests/oracles/: downloads, minutes), and the subprocess tests (CLI,
    README, packaging, checkpoints killed mid-write, the SmolLM2 commands), for speed.
A model mutant runs CORE (test_fast_paths.py in it: a torch norm's written-out code is
compared only there, the fused kernel runs everywhere else; ``--full``: every other file
too); a file in BY_PATH runs the files that exercise it. The mutation tests (MUTATION_TESTS:
the tests written for the mutants that survived the rest, each in the file of its subject) are
left out of that run and run after it, on their own, so a mutant killed only by them shows it:
the score "without" them is the suite's before they were written. ``--quick``: each mutant runs the
edit-test loop's run instead (``pytest shared_tests --quick``, EXCLUDED left out; the mutation tests
in it): the quick run's kill rate. A jax or torch mutant runs for that
backend only; a NumPy mutant runs for torch (held to NumPy, it sees NumPy's bugs, and the
NumPy-only tests run too); a mutant of a backend-neutral package runs for numpy.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from .mutant_list import MUTANTS, Mutant

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXCLUDED = {"repository/test_docs.py", "repository/test_mirror.py", "cli/test_cli.py", "cli/test_cli_errors.py",
            "cli/test_cli_generate.py", "repository/test_readme.py", "repository/test_packages.py",
            "training/test_checkpoints.py", "cli/test_smollm2_sentence.py"}  # fmt: skip
# A model mutant runs these, in this order (paths under shared_tests/).
CORE = ["decoding/test_decoding_search.py", "models/test_models.py", "components/test_fast_paths.py",
        "components/test_components.py", "components/test_modern.py", "training/test_gradients.py",
        "decoding/test_decoding.py", "training/test_dropout.py", "training/test_training.py", "models/test_params.py",
        "components/test_attention_properties.py", "models/test_spec.py", "inputs/test_errors.py"]  # fmt: skip
# The tests written for the mutants that survived everything else (each docstring names the
# mutants it kills): left out of the first run and run after it, so that a mutant they kill
# shows as killed by them only (the score before them).
MUTATION_TESTS = [
    "models/test_models.py::test_the_encoder_and_decoder_final_norms_follow_their_own_flags",
    "training/test_dropout.py::test_dropout_sits_where_numpys_does_under_the_same_fixed_masks",
    "training/test_dropout.py::test_dropout_gradients_match_numpys_under_the_same_fixed_masks",
    "decoding/test_decoding_search.py::test_beam_search_with_no_finished_hypothesis_returns_the_best_running_one_length_normalised",
    "training/test_gradients.py::test_the_loss_skips_the_configured_pad_id_not_token_0",
    "interop/test_converters.py::test_their_names_hold_the_tensors_the_libraries_give_them",
    "interop/test_converters.py::test_marian_export_refuses_two_different_tables_only_into_a_shared_checkpoint",
    "interop/test_weights_files.py::test_added_later_names_exactly_the_fields_that_the_earlier_files_lack",
    "interop/test_weights_files.py::test_a_file_of_an_earlier_version_loads_as_the_model_it_was_written_from",
    "components/test_tiled_attention.py::test_a_one_column_key_mask_with_an_empty_row_gives_numpys_tiled_results_in_every_backend",
    "models/test_jax_specifics.py::test_jit_compiled_forward_returns_what_its_one_output_flag_asks_for",
    "decoding/test_decoding.py::test_a_growing_cache_grows_or_refuses_as_numpys_does",
]


# The search, the tokenizer, the converters, the schedules, the exercises' checker, JAX's stepper, torch's and
# JAX's compiled() wrappers and the tiled attention: the files that exercise them (a model mutant runs everything
# above; these run in seconds instead of minutes).
BY_PATH = {
    "transformer_run/decoding.py": [
        "decoding/test_decoding_search.py",
        "decoding/test_decoding.py",
        "components/test_modern.py",
        "inputs/test_inputs.py",
        "inputs/test_errors.py",
    ],
    "transformer_text/tokenizer.py": ["inputs/test_inputs.py", "models/test_spec.py", "inputs/test_errors.py"],
    "transformer_run/schedules.py": ["training/test_training.py", "models/test_spec.py", "training/test_gradients.py"],
    "transformer_course/check.py": ["notebooks/test_exercises.py"],
    "transformer_course/exercises/parts.py": ["notebooks/test_exercises.py"],
    "torch_impl/compiled.py": ["models/test_torch_compiled.py"],
    "jax_impl/compiled.py": ["models/test_jax_specifics.py"],
    **{f"{backend}_impl/tiled_attention.py": ["components/test_tiled_attention.py", "components/test_fast_paths.py"]
       for backend in ("numpy", "jax", "torch")},
    "jax_impl/generate.py": ["models/test_jax_specifics.py", "decoding/test_decoding.py", "components/test_modern.py",
                             "decoding/test_decoding_search.py", "inputs/test_errors.py"],
}  # fmt: skip
for _converter in ("hf_bert", "hf_llama", "hf_gpt2", "hf_marian", "rope", "gguf", "torch_transformer"):
    BY_PATH[f"transformer_convert/{_converter}.py"] = ["interop/test_converters.py", "components/test_modern.py",
                                                    "interop/test_weights_files.py", "models/test_params.py",
                                                    "models/test_spec.py"]  # fmt: skip


def test_files(root: pathlib.Path, mutant: Mutant | None = None, full: bool = False) -> list[str]:
    """CORE (or, for a mutant of a file in BY_PATH, those files); with ``full``: the whole shared
    suite minus EXCLUDED and the oracles. The mutation tests are not in them (``--deselect``ed)."""
    suite = root / "shared_tests"
    names = sorted(p.relative_to(suite).as_posix() for p in suite.rglob("test_*.py"))
    if full:
        chosen = [n for n in names if n not in EXCLUDED and not n.startswith("oracles/")]
    elif mutant is not None and mutant.path in BY_PATH:
        chosen = BY_PATH[mutant.path]
    else:
        chosen = CORE
    return [f"shared_tests/{n}" for n in chosen if n in names]


def pytest_command(mutant: Mutant, root: pathlib.Path, workers: int, full: bool = False,
                   mutation_tests: bool = False, quick: bool = False) -> list[str]:  # fmt: skip
    """The run of the chosen files without the mutation tests; ``mutation_tests``: the run of those alone;
    ``quick``: the edit-test loop's run (``pytest shared_tests --quick``, the mutation tests in it), without
    EXCLUDED."""
    backend = mutant.backend
    if quick:
        tests = ["shared_tests", "--quick", *(f"--ignore=shared_tests/{name}" for name in sorted(EXCLUDED))]
    elif mutation_tests:
        tests = [f"shared_tests/{t}" for t in MUTATION_TESTS]
    else:
        tests = [*test_files(root, mutant, full), *(f"--deselect=shared_tests/{t}" for t in MUTATION_TESTS)]
    args = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider"]
    args += ["-o", "addopts=", "-rfE", "--tb=line", "-W", "ignore::pytest.PytestUnraisableExceptionWarning"]
    if backend in ("jax", "torch"):
        args.append(f"--backend={backend}")
    elif backend is None:
        args.append("--backend=numpy")
    elif not full:  # NumPy is the reference: torch, held to it, sees its bugs (and its own tests run)
        args.append("--backend=torch")
    if workers > 1:
        args += ["-n", str(workers)]
    return args


def export_tree(dest: pathlib.Path, worktree: bool) -> None:
    """The repository's files (HEAD, or the working tree as it is) into ``dest``."""
    if worktree:
        ignore = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache", ".nox", "site", "*.egg-info")
        shutil.copytree(ROOT, dest, ignore=ignore)
        return
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def apply(mutant: Mutant, root: pathlib.Path) -> None:
    path = root / mutant.path
    text = path.read_text(encoding="utf-8")
    count = text.count(mutant.original)
    if count != 1:
        raise ValueError(f"{mutant.name}: the original text occurs {count} times in {mutant.path}, not once")
    path.write_text(text.replace(mutant.original, mutant.replacement), encoding="utf-8")


def environment(root: pathlib.Path, single_thread: bool) -> dict[str, str]:
    env = os.environ | {"PYTHONPATH": str(root)}
    if single_thread:  # two runs side by side on a small machine: one thread each
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = "1"
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return env


def check_imports(root: pathlib.Path) -> None:
    """The copy's packages are the ones imported, not the editable install's."""
    code = "import numpy_impl, transformer_spec, shared_tests; print(numpy_impl.__file__, transformer_spec.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=environment(root, False), cwd=root, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    if not all(pathlib.Path(p).resolve().is_relative_to(root.resolve()) for p in out.split()):
        raise RuntimeError(f"the copy in {root} is not what gets imported: {out}")


@dataclasses.dataclass
class Result:
    name: str
    path: str
    description: str
    status: str  # killed, survived, timeout, error
    seconds: float
    detail: str  # the first failing test, or the last lines of the output

    @property
    def killed_only_by_mutation_tests(self) -> bool:
        """Killed by MUTATION_TESTS, which run last: every other test passed."""
        return self.status == "killed" and any(f"shared_tests/{t}" in self.detail for t in MUTATION_TESTS)


def run_one(mutant: Mutant, base: pathlib.Path, scratch: pathlib.Path, timeout: float, workers: int,
            single_thread: bool, full: bool, quick: bool = False) -> Result:  # fmt: skip
    root = scratch / mutant.name
    shutil.copytree(base, root)
    start = time.monotonic()
    try:
        apply(mutant, root)
        for mutation_tests in (False,) if quick else (False, True):  # the mutation tests only if the rest passed
            command = pytest_command(mutant, root, workers, full, mutation_tests, quick)
            left = timeout - (time.monotonic() - start)
            try:
                proc = subprocess.run(command, cwd=root, env=environment(root, single_thread), capture_output=True,
                                      text=True, timeout=left)  # fmt: skip
            except subprocess.TimeoutExpired:
                return Result(mutant.name, mutant.path, mutant.description, "timeout", time.monotonic() - start, "")
            if proc.returncode != 0:
                break
        output = proc.stdout + proc.stderr
        lines = [line for line in output.splitlines() if line.strip()]
        failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        if proc.returncode == 0:
            status, detail = "survived", lines[-1] if lines else ""
        elif proc.returncode == 1:
            status, detail = "killed", failed[0] if failed else (lines[-1] if lines else "")
        else:  # 2: interrupted (a collection error is a kill too: the suite does not run), 3-5: pytest itself
            status = "killed" if proc.returncode == 2 else "error"
            detail = "\n".join(lines[-5:])
        return Result(mutant.name, mutant.path, mutant.description, status, time.monotonic() - start, detail)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this mutant only (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run side by side (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers per mutant (default 1: none)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per mutant (default 1200)")
    parser.add_argument("--json", default=str(ROOT / "tools" / "mutants_results.json"), help="where to write results")
    parser.add_argument("--full", action="store_true", help="every mutant runs the whole suite (minus EXCLUDED)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every mutant runs the quick run (pytest shared_tests --quick, minus EXCLUDED)",
    )
    parser.add_argument("--worktree", action="store_true", help="mutate the working tree as it is, not HEAD")
    parser.add_argument("--check", action="store_true", help="only check that every mutant applies, run nothing")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)

    known = {m.name for m in MUTANTS}
    if len(known) != len(MUTANTS):
        raise SystemExit("two mutants share a name")
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(unknown)}")
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:<48} {m.path:<32} {m.description}")
        return 0

    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        scratch = pathlib.Path(tmp)
        base = scratch / "_base"
        export_tree(base, args.worktree)
        for m in mutants:  # every snippet occurs exactly once, before anything runs
            text = (base / m.path).read_text(encoding="utf-8")
            if text.count(m.original) != 1:
                raise SystemExit(f"{m.name}: the original occurs {text.count(m.original)} times in {m.path}")
        if args.check:
            print(f"{len(mutants)} mutants apply cleanly")
            return 0
        check_imports(base)
        started = time.monotonic()
        results: list[Result] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {
                pool.submit(run_one, m, base, scratch, args.timeout, args.workers, args.jobs > 1, args.full,
                            args.quick): m
                for m in mutants
            }  # fmt: skip
            for future in concurrent.futures.as_completed(futures):
                result = future.result()
                results.append(result)
                print(f"[{len(results):>2}/{len(mutants)}] {result.status:<8} {result.seconds:6.0f}s  {result.name}",
                      flush=True)  # fmt: skip
        elapsed = time.monotonic() - started

    order = {m.name: i for i, m in enumerate(MUTANTS)}
    results.sort(key=lambda r: order[r.name])
    killed = sum(r.status == "killed" for r in results)
    print(f"\n{'mutant':<48} {'status':<9} {'time':>6}  detail")
    for r in results:
        print(f"{r.name:<48} {r.status:<9} {r.seconds:5.0f}s  {r.detail.splitlines()[0][:100] if r.detail else ''}")
    score = killed / len(results) if results else 0.0
    before = killed - sum(r.killed_only_by_mutation_tests for r in results)
    print(f"\nmutation score: {killed}/{len(results)} killed ({score:.0%}); {elapsed:.0f}s")
    print(f"without the mutation tests: {before}/{len(results)} killed (the mutants only they kill survive the rest)")
    survivors = [r.name for r in results if r.status != "killed"]
    if survivors:
        print("not killed: " + ", ".join(survivors))
    payload = {"killed": killed, "killed_without_mutation_tests": before, "total": len(results), "score": score,
               "seconds": round(elapsed),
               "command": " ".join(["python -m tools.mutants", *(argv if argv is not None else sys.argv[1:])]),
               "results": [dataclasses.asdict(r) | {"seconds": round(r.seconds, 1),
                                                    "killed_only_by_mutation_tests": r.killed_only_by_mutation_tests}
                           for r in results]}  # fmt: skip
    pathlib.Path(args.json).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0 if not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
