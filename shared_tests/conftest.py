"""Fixtures: ``backend`` (each installed backend, or those named with --backend) and ``reference``.

JAX's float64 switch must be set before any JAX array exists, so it is set here, at
collection time, whenever JAX is installed.

Under pytest-xdist (``pytest -n 2``, as nox runs the suite) each worker is one process on one
core: its BLAS, torch and XLA thread pools are set to one thread before any framework is
imported (two workers with a pool of two threads each fight over two cores), and the records
of the worst errors (``tolerances.py``) travel from the workers to the controller, which
prints them and writes ``--parity-json``.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import pathlib
import platform
import shlex
import shutil
import sys
import tempfile
import time

from . import LIGHT_XLA_FLAGS

# XLA's cheaper code generation, for every process of the run (the xdist workers, the children they
# start, the notebooks' kernels inherit it): LLVM's light passes and the older elemental emitters.
# Compiling, not running, is most of the JAX tests' time (each new shape of an eager operation is an
# XLA program of its own), and these flags halve it; the HLO passes, so the programs' math, the
# collectives and the memory plan, are XLA's usual ones. The code generator users run by default is
# held to the same numbers by models/test_jax_specifics.py's
# test_the_default_code_generator_computes_what_the_suites_computes. SHARED_TESTS_XLA=default runs the
# whole suite with XLA's defaults.
if os.environ.get("SHARED_TESTS_XLA", "light") != "default":
    _flags = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join([*_flags, *(f for f in LIGHT_XLA_FLAGS if f not in _flags)])

if os.environ.get("SHARED_TESTS_HIDE"):
    # The packages named here (comma-separated) are as if not installed, in this process and its xdist
    # workers: importing one raises ModuleNotFoundError and importlib.util.find_spec finds nothing. The
    # noxfile's suite session runs the suite so, as the numpy session's environment would be, to hold
    # that a test needing a framework skips, naming it, where that framework is not installed.
    for _name in os.environ["SHARED_TESTS_HIDE"].split(","):
        sys.modules[_name.strip()] = None

if os.environ.get("PYTEST_XDIST_WORKER"):  # set by xdist before the worker reads this file
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    # On a GPU, JAX takes 75% of its memory when a process first uses it: the second worker found
    # none left and most of the JAX tests failed (measured on an H200 with 12 workers; in one
    # process they pass, at 3e-15). Workers take what they need instead.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

if "JAX_COMPILATION_CACHE_DIR" not in os.environ and importlib.util.find_spec("jax") is not None:
    # One persistent compilation cache for this run, shared by its xdist workers and by the
    # processes its tests start (they inherit the variables): a program compiled once (the same
    # model kind and shapes, in another test, worker or process) is read back instead of
    # compiled again; measured 25% less CPU time on the JAX-heavy tests. Removed at the end by
    # the process that made it; set JAX_COMPILATION_CACHE_DIR yourself to keep one across runs.
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache = tempfile.mkdtemp(prefix="shared-tests-jax-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ and importlib.util.find_spec("torch") is not None:
    # The same for torch.compile (shared_tests/models/test_torch_compiled.py): Inductor's built
    # code, one folder for this run's workers, read back where a graph was compiled before.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _torch_cache = tempfile.mkdtemp(prefix="shared-tests-inductor-")
    atexit.register(shutil.rmtree, _torch_cache, ignore_errors=True)

import pytest

from transformer_backends import get_backend
from transformer_backends.names import BACKENDS

from . import tolerances
from .timing import pytest_addoption as _timing_options
from .timing import (  # noqa: F401  (hooks: pytest reads them from this module)
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    timing_records,
    write_timing,
)

if importlib.util.find_spec("jax") is not None:
    import jax

    jax.config.update("jax_enable_x64", True)


def pytest_addoption(parser):
    _timing_options(parser)
    parser.addoption(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="run the suite for this backend only (repeatable); default: every installed backend",
    )
    parser.addoption(
        "--one-case",
        action="store_true",
        help="of every test function, one case per backend (its first): every claim runs once in every backend",
    )
    parser.addoption(
        "--quick",
        action="store_true",
        help="the edit-test loop's run (nox -s quick): --one-case, and the slow set (SLOW) left out",
    )
    parser.addoption(
        "--parity-json",
        metavar="PATH",
        help="write every test's worst measured error per check and dtype to PATH (read by python -m docs.build)",
    )


def pytest_generate_tests(metafunc):
    if "backend_name" in metafunc.fixturenames:
        names = metafunc.config.getoption("--backend") or list(BACKENDS)
        metafunc.parametrize("backend_name", names, scope="session")


# The slow set (marker ``slow``): every test function with a case that took 8 s or more in a run of the
# suite on the 2-core CPU (JAX compiling training steps and decoders, real processes, torch.compile, the
# real SmolLM2; python -m tools.suite_time's records), by file (its path under shared_tests/). CI runs
# them all; ``--quick`` and ``-m "not slow"`` leave them out. Under xdist they are handed out first, so
# that no worker is left with a long test at the end while the others idle.
SLOW = {
    "training/test_checkpoints.py": {
        "test_a_checkpoint_is_a_weights_file_every_backend_loads",
        "test_a_killed_run_resumes_to_the_uninterrupted_loss_curve",
        "test_a_run_resumed_from_its_checkpoint_file_continues_exactly",
        "test_the_state_holds_adam_moments_in_the_weights_layout_equal_in_every_backend",
    },
    "oracles/test_oracle_smollm2_model.py": {
        "test_greedy_tokens_equal_transformers_generate",
        "test_logits_at_every_position_match_transformers",
        "test_the_three_backends_agree_to_1e_12_in_float64",
    },
    "oracles/test_oracle_smollm2_transformers.py": {"test_last_logits_match_transformers_loading_the_same_file"},
    "oracles/test_oracle_paper_base.py": {"test_one_adam_step_of_paper_base_runs_with_one_shared_table"},
    "training/test_dropout.py": {
        "test_dropout_gradients_match_numpys_under_the_same_fixed_masks",
        "test_dropout_sits_where_numpys_does_under_the_same_fixed_masks",
        "test_train_trains_with_dropout_and_leaves_inference_mode",
        "test_training_mode_masks_are_random_and_reproducible_from_the_seed",
    },
    "training/test_gradients.py": {
        "test_float32_models_get_float32_gradients",
        "test_loss_and_gradients_match_reference",
        "test_shared_table_gradient_is_the_sum_of_its_three_uses",
    },
    "components/test_fast_paths.py": {"test_gradients_are_the_same_with_and_without_fused_kernels"},
    "decoding/test_decoding.py": {"test_cached_and_uncached_steppers_give_the_same_logits"},
    "training/test_training.py": {
        "test_a_checkpoint_moves_between_backends_and_the_numbers_carry_on",
        "test_every_backend_learns_the_copy_task_to_exact_greedy_outputs",
        "test_float64_loss_curves_follow_the_reference_step_by_step",
    },
    "components/test_modern.py": {
        "test_modern_models_decode_the_same_tokens_in_every_backend",
        "test_rotary_cache_holds_kv_heads_and_cached_equals_uncached",
    },
    "models/test_trace.py": {"test_the_same_weights_agree_everywhere_in_compare_traces"},
    "cli/test_smollm2_sentence.py": {
        "test_attention_command_draws_the_chosen_layers_and_heads",
        "test_trace_command_traces_the_real_model_and_the_backends_agree_in_float64",
    },
    "inputs/test_inputs.py": {"test_records_of_another_model_in_another_thread_do_not_reach_the_trace"},
    # torch's sharded runs: a group of 2 and one of 4 gloo processes, forked by one launcher
    "sharding/test_torch_sharding.py": {
        "test_2d_meshes_and_fsdp_over_4_processes_equal_one_device",
        "test_fsdp_and_tensor_parallel_over_2_processes_equal_one_device",
    },
    # JAX's sharded runs: two child processes on 4 simulated devices, which every test waits for
    "sharding/test_jax_sharding.py": {
        "test_fsdp_over_4_devices_allocates_under_0_3_of_one_devices_bytes",
        "test_a_sharded_runs_checkpoint_holds_whole_tensors_every_backend_loads",
        "test_with_dropout_every_plan_is_the_single_device_run_with_the_same_seed",
        "test_every_plan_gives_the_single_device_loss_and_gradients",
        "test_the_compiled_step_runs_numpys_collectives_as_xla_rewrites_them",
        "test_the_shard_map_blocks_equal_the_jit_blocks_and_one_device_with_megatrons_all_reduces",
        "test_twenty_float64_adam_steps_give_the_single_device_losses_and_weights",
    },
    # random (config, plan) pairs: each accepted one run in every backend against one device
    "sharding/test_random_plans.py": {
        "test_a_random_plan_is_refused_naming_the_weight_and_sizes_or_runs_to_one_devices_numbers",
        "test_a_sample_of_random_plans_is_refused_with_check_plans_message_or_runs_to_one_devices_numbers",
    },
    # JAX across processes: one launch of two jax.distributed processes, which every test waits for
    "sharding/test_jax_processes.py": {
        "test_a_sharded_checkpoint_saved_across_processes_resumes_there_under_another_plan",
        "test_each_plan_across_processes_gives_the_single_device_loss_and_gradients",
        "test_every_process_computes_the_same_numbers",
        "test_twenty_adam_steps_across_processes_give_the_single_device_losses_and_weights",
    },
    # torch across nodes: two torchrun invocations of 2 gloo ranks each, which every test waits for
    "sharding/test_torch_nodes.py": {
        "test_each_plan_across_nodes_gives_the_single_device_loss_and_gradients",
        "test_the_ranks_span_two_nodes_and_compute_the_same_numbers",
        "test_twenty_adam_steps_across_nodes_give_the_single_device_losses_and_weights",
    },
    # torch's sharded checkpoints: groups of 2, 4, 2 and 1 gloo ranks forked by one launcher, saving and resuming
    "sharding/test_torch_checkpoints.py": {
        "test_torch_s_checkpoint_saved_under_one_plan_resumes_under_another",
        "test_torch_s_checkpoint_consolidated_resumes_in_numpy",
        "test_torch_s_checkpoint_consolidated_resumes_in_jax",
        "test_torch_s_checkpoint_holds_each_rank_s_shards_and_consolidates",
        "test_numpy_s_checkpoint_consolidated_resumes_in_torch_under_a_plan",
        "test_saving_under_fsdp_4_holds_each_rank_s_own_shards",
    },
    # JAX's sharded checkpoints, computed in test_jax_sharding.py's child for the Llama-style decoder
    "sharding/test_jax_checkpoints.py": {
        "test_the_uninterrupted_run_is_the_reference_single_devices",
        "test_a_run_saved_under_one_plan_resumes_under_another_as_if_never_stopped",
        "test_numpy_s_checkpoint_consolidated_resumes_in_jax_under_each_plan",
        "test_jax_s_checkpoint_consolidated_resumes_in_numpy",
        "test_jax_s_checkpoint_consolidated_resumes_in_torch",
        "test_restore_places_every_weight_and_moment_as_the_new_plan_does_and_sets_adams_step",
        "test_whole_tensors_reads_the_saved_weights_and_moments_by_their_canonical_names",
        "test_a_save_killed_before_its_commit_is_never_read",
        "test_saving_under_fsdp_4_holds_each_process_s_own_shards",
    },
    # NumPy's sharded checkpoints through the command line: three commands in-process, a JAX compile among them
    "sharding/test_sharded_checkpoints.py": {"test_the_command_line_saves_resumes_under_another_plan_and_consolidates"},
    # a lost rank: two torchrun jobs and two jobs of 2 JAX processes, the second restarted twice
    "sharding/test_lost_rank.py": {"test_a_job_that_loses_a_rank_ends_bit_for_bit_where_the_uninterrupted_one_ends"},
    # each chapter of the course in a fresh kernel (the real SmolLM2 chapter the longest), JupyterLab in Chromium
    "notebooks/test_notebooks.py": {
        "test_the_chapter_runs_top_to_bottom",
        "test_without_the_real_weights_the_real_model_chapter_says_so_and_runs_the_tiny_preset",
    },
    "notebooks/test_jupyterlab.py": {"test_a_chapter_opens_runs_and_renders_in_jupyterlab_in_chromium"},
    "cli/test_cli_generate.py": {"test_generate_reports_the_compiling_calls_apart_from_the_steady_rate"},
    "models/test_models.py": {"test_random_models_give_the_references_logits_at_real_positions"},
    "models/test_torch_compiled.py": {"test_compiled_forward_equals_eager_forward"},
    "models/test_jax_specifics.py": {"test_the_default_code_generator_computes_what_the_suites_computes"},
    "repository/test_docs.py": {
        "test_a_comment_or_blank_line_in_a_backend_fails_nothing_but_a_rename_fails_by_name",
        "test_every_page_fits_at_1000_1400_and_1900_px",
    },
    "training/test_data_parallel.py": {
        "test_data_parallel_step_equals_the_single_device_step",
        "test_the_train_command_trains_data_parallel_with_the_single_device_losses",
    },
    "oracles/test_oracle_smollm2_files.py": {
        "test_halves_and_interleaved_loads_differ_exactly_by_the_rope_permutation",
        "test_the_file_gives_the_smollm2_preset",
    },
    "oracles/test_oracle_bert.py": {"test_sentence_embeddings_match_sentence_transformers"},
    "oracles/test_oracle_torch_eager.py": {
        "test_compiled_decoding_steps_equal_eager_steps",
        "test_compiled_forward_equals_eager_forward_in_float32",
        "test_compiled_training_steps_equal_eager_steps",
    },
}


# Under --dist=loadgroup the tests of one group run on one worker, one after the other, so a module-scoped
# fixture is built once: each oracle file loads its real models (MiniLM, SmolLM2, transformers' copies of
# them) once, the real SmolLM2's command-line tests read the file once, and one worker pays torch.compile's
# start-up for both files that compile. Every other test is a group of its own, handed to whichever worker
# is free.
GROUPS = {
    "cli/test_smollm2_sentence.py": "cli/test_smollm2_sentence.py",
    "cli/test_cli_generate.py": "cli/test_cli_generate.py",
    "models/test_torch_compiled.py": "torch.compile",
    "oracles/test_oracle_torch_eager.py": "torch.compile",
}


def group_of(file: str) -> str | None:
    """The group of a test file (its path under shared_tests/), or None: it has none."""
    return GROUPS.get(file) or (file if file.startswith("oracles/") else None)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # an xdist hook, asked before xdist's own answer
def pytest_xdist_make_scheduler(config, log):
    """--dist=loadgroup as GROUPS says. xdist's own loadgroup reads the groups from the test ids, where
    it writes the xdist_group marks into them; pytest 9.2 derives a test's id from its structured
    address, so those writes no longer reach the id, and every test would be a group of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            file = path.split("shared_tests/", 1)[1] if "shared_tests/" in path else path
            return group_of(file) or nodeid

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    here = pathlib.Path(__file__).resolve().parent
    for item in items:
        file = item.path.resolve().relative_to(here).as_posix() if item.path.resolve().is_relative_to(here) else ""
        if getattr(item, "originalname", item.name) in SLOW.get(file, ()):
            item.add_marker(pytest.mark.slow)
    quick = config.getoption("--quick")
    if quick or config.getoption("--one-case"):
        kept, seen = [], set()
        for item in items:
            params = getattr(item, "callspec", None)
            values = params.params.values() if params else ()
            backend = next((v for v in values if isinstance(v, str) and v in BACKENDS), None)
            key = (item.path, getattr(item, "originalname", item.name), backend)
            if not (quick and item.get_closest_marker("slow")) and key not in seen:
                seen.add(key)
                kept.append(item)
        kept_ids = {id(item) for item in kept}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept_ids])
        items[:] = kept
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: the controller hands out this order
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def backend(backend_name):
    try:
        return get_backend(backend_name)
    except ImportError as error:
        pytest.skip(f"backend {backend_name!r} is not installed ({error.name}); install the [{backend_name}] extra")


@pytest.fixture(scope="session")
def reference():
    """The NumPy backend, run in float64: every other result is held to it."""
    return get_backend("numpy")


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A command run in-process on a real model (``transformer_cli.threads.use_threads``: torch's
    default, a thread per core, for a large model) sets torch's thread count for the whole process;
    left so, every later torch test of that worker ran two threads on a core shared with the other
    worker, waiting on each other (the float32 copy task: 66 s instead of 10). Put back after each test."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else int(os.environ.get("OMP_NUM_THREADS", "0"))
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _record_backend(request):
    """Tell the tolerance table which backend the current test holds to the reference."""
    params = getattr(request.node, "callspec", None)
    tolerances.current_backend["name"] = params.params.get("backend_name", "-") if params else "-"
    tolerances.current_backend["test"] = request.node.name
    tolerances.current_backend["nodeid"] = request.node.nodeid
    tolerances.current_backend["oracle"] = getattr(request.module, "ORACLE", "numpy float64")


_TIMING_RUNS: list[dict] = []  # the controller's: each worker's timing records (--timing-json)
_RUN_STARTED = time.monotonic()
_RECORDS = ("WORST", "PARITY", "GRADIENT_WORST", "CURVE_WORST")  # tolerances' dicts, keyed by tuples


def _merge_records(records: dict) -> None:
    """Fold one xdist worker's records into this process's: the worst error wins, counts add up."""
    for (backend, oracle, dtype), (error, where) in records["WORST"]:
        key = (backend, oracle, dtype)
        if error > tolerances.WORST.get(key, (-1.0, ""))[0]:
            tolerances.WORST[key] = (error, where)
    for key, (error, where) in records["GRADIENT_WORST"]:
        key = tuple(key)
        if error > tolerances.GRADIENT_WORST.get(key, (-1.0, ""))[0]:
            tolerances.GRADIENT_WORST[key] = (error, where)
    for key, error in records["CURVE_WORST"]:
        key = tuple(key)
        tolerances.CURVE_WORST[key] = max(error, tolerances.CURVE_WORST.get(key, 0.0))
    for key, (error, count, tolerance, backend, oracle) in records["PARITY"]:
        entry = tolerances.PARITY.setdefault(tuple(key), [0.0, 0, tolerance, backend, oracle])
        entry[0], entry[1] = max(entry[0], error), entry[1] + count


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist installed it is never called
def pytest_testnodedown(node, error):
    """xdist's controller: a worker finished; take its records."""
    records = getattr(node, "workeroutput", {}).get("tolerances")
    if records:
        _merge_records(json.loads(records))
    timing = getattr(node, "workeroutput", {}).get("timing")
    if timing:
        _TIMING_RUNS.append(json.loads(timing))


def pytest_terminal_summary(terminalreporter):
    if tolerances.GRADIENT_WORST:
        terminalreporter.section("worst gradient error per backend (see GRADIENT_TOLERANCE)")
        for (backend, check), (error, where) in sorted(tolerances.GRADIENT_WORST.items()):
            terminalreporter.write_line(f"{backend:<6} {check:<20} {error:.2e}  at {where}")
    if tolerances.CURVE_WORST:
        terminalreporter.section("float64 loss curves vs the NumPy reference: max relative difference per step")
        for (backend, run), error in sorted(tolerances.CURVE_WORST.items()):
            terminalreporter.write_line(f"{backend:<6} {run:<22} {error:.2e}")
    if not tolerances.WORST:
        return
    terminalreporter.section("worst measured difference / max |reference|, per backend, reference and dtype")
    for (backend, oracle, dtype), (error, where) in sorted(tolerances.WORST.items()):
        tol = tolerances.TOLERANCE[dtype]
        terminalreporter.write_line(
            f"{backend:<6} vs {oracle:<22} {dtype:<8} {error:.2e} (tolerance {tol:.0e})  at {where}"
        )


def pytest_sessionfinish(session):
    """With --parity-json PATH: every test's worst error per check and dtype, sorted (a stable file).
    An xdist worker hands its records to the controller instead (``pytest_testnodedown``)."""
    if hasattr(session.config, "workeroutput"):
        records = {name: [[list(k), v] for k, v in getattr(tolerances, name).items()] for name in _RECORDS}
        session.config.workeroutput["tolerances"] = json.dumps(records)
        if session.config.getoption("--timing-json"):
            session.config.workeroutput["timing"] = json.dumps(timing_records())
        return
    if session.config.getoption("--timing-json"):
        runs = _TIMING_RUNS or [timing_records()]  # without xdist this process ran the tests
        write_timing(session.config.getoption("--timing-json"), runs, time.monotonic() - _RUN_STARTED)
    path = session.config.getoption("--parity-json")
    if not path:
        return
    versions = {"python": platform.python_version()}
    for name in ("numpy", "jax", "flax", "torch"):
        if name not in sys.modules:  # under xdist the frameworks ran in the workers only
            try:
                importlib.import_module(name)
            except ImportError:
                continue
        versions[name] = getattr(sys.modules[name], "__version__", "?")
    tests = [
        {"test": test, "check": check, "dtype": dtype, "backend": backend, "reference": oracle,
         "worst": worst, "comparisons": count, "tolerance": tolerance}
        for (test, check, dtype), (worst, count, tolerance, backend, oracle) in sorted(tolerances.PARITY.items())
    ]  # fmt: skip
    command = shlex.join(["pytest", *session.config.invocation_params.args])
    with open(path, "w", encoding="utf-8") as f:  # one test per line: a readable diff when remeasured
        f.write(f'{{\n "command": {json.dumps(command)},\n "versions": {json.dumps(versions, sort_keys=True)},\n')
        f.write(' "tests": [\n' + ",\n".join("  " + json.dumps(t, sort_keys=True) for t in tests) + "\n ]\n}\n")
