"""Random plans on random models: ``check_plan`` refuses a (config, plan) pair in one line naming the
weight, the split and the sizes exactly when some split ``piece`` would make is uneven (tensor
parallel's, then FSDP's of the part tensor parallel left), and every pair it accepts runs and gives
one device's loss and gradients in float64 (1e-12, as test_numpy_sharding.py).

The pairs: the decoder kinds of ``helpers.configs`` (every norm, activation, positional encoding,
gated or plain feed-forward, biases on or off, tied or untied output, shared tables, grouped-query
attention), their sizes redrawn from values with several divisors, and plans of 1 to 8 devices
(tensor parallel 1 to 4, times FSDP or data parallel). 200 pairs in NumPy (and 300 more, the
encoder among them, through check_plan alone); a sample of the same draws in JAX (one child on 8 simulated CPU devices) and in torch (a launcher that forks each world
size's gloo ranks once, as test_torch_sharding.py's does), whose ``sharded_loss_and_grads`` must
refuse with check_plan's very message or run to NumPy's single device's numbers. processes.py
starts the two, once per test run; each records every pair it ran (the config, the plan, the
refusal or the loss and gradients), and the tests here hold the records to the statement.

The expected outcome is not check_plan's own arithmetic: ``uneven_split`` asks ``piece`` itself,
for every weight and device, whether it can cut the weight, the way the sharded runs will.
"""

from __future__ import annotations

import collections
import json
import math
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from transformer_backends.tolerances import TOLERANCE
from transformer_run.batches import decoder_only_batch, encoder_decoder_batch
from transformer_run.sharding import Plan, check_plan, piece, placement
from transformer_spec import Config, param_schema

from ..helpers import configs, hypothesis_settings
from .cases import gradient_error, params_of
from .processes import run_group

KINDS = ("encoder_decoder", "decoder_only")  # the kinds with a loss to shard (an encoder has no logits)
# Sizes are drawn for the plan, so that most pairs get past the whole weights and many meet an uneven
# part only after tensor parallel's cut (d_ff 6 over 2 model ranks leaves 3 per rank: FSDP 2 divides
# 6, not 3): mostly sizes tensor parallel divides (a part per model rank times tensor_parallel) and
# FSDP divides (d_model = heads x d_k, the vocabularies, the position table), now and then any; a
# model rank's part of d_ff that FSDP divides or not, as often.
HEADS = (1, 2, 3, 4, 6)
HEADS_PER_RANK = (1, 2)
D_K = (2, 3, 4)
D_K_ROTARY = (2, 4)  # rotary rotates pairs
D_FF = (4, 6, 8, 12)
D_FF_PER_RANK = (2, 3, 4, 6, 8, 9)
VOCABS = (12, 16, 18, 24, 48)
MAX_LENS = (8, 12, 24)  # a learned position table is split too; each holds SRC_LEN and TGT_LEN
SRC_LEN, TGT_LEN = 5, 4
NUMPY_PAIRS = 200
SAMPLE = {"runs": 6, "refused": 14}  # the JAX and torch sample: pairs that run, pairs refused
RANK_TIMEOUT = 300  # seconds a torch rank waits in a collective for the others
# what becomes of a pair: it runs, or is refused at the first uneven cut
RUNS = "runs"
TP_SIZES = "tensor parallel on the heads or d_ff"  # a head is never cut, nor a hidden feature
TP_WEIGHT = "tensor parallel on a weight"  # none once it divides those (a safety net)
FSDP_WHOLE = "fsdp on a dimension tensor parallel left whole"
AFTER_TP = "fsdp on the part tensor parallel left"  # a column-split bias, cut twice


# ------------------------------------------------------------------------------ the pairs
def every_plan(devices: int = 8) -> list[Plan]:
    """Every plan of 1 to ``devices`` devices: tensor parallel 1 to 4, times FSDP or data parallel
    over 1 to 8; FSDP x tensor parallel four times over (the pairs that cut a bias twice)."""
    out = []
    for k in (1, 2, 3, 4):
        for data in (n for n in (1, 2, 3, 4, 6, 8) if n * k <= devices):
            out += [Plan(fsdp=data, tensor_parallel=k)] * (4 if data > 1 and k > 1 else 1)
            out += [Plan(data_parallel=data, tensor_parallel=k)] if data > 1 else []
    return out


@st.composite
def sharded_cases(draw, kinds: tuple[str, ...] = KINDS) -> tuple[Config, Plan]:
    """A plan, and a model of ``helpers.configs`` (every switch drawn) with sizes drawn for it,
    without dropout (the loss and gradients of one pass; dropout's runs, where every device draws the
    one device's masks, are test_<backend>_sharding.py's)."""
    plan = draw(st.sampled_from(every_plan()))
    k, f = plan.tensor_parallel, plan.fsdp
    base = draw(configs(kinds))

    def often(times: int) -> bool:  # True ``times`` times in ``times + 1``
        return draw(st.sampled_from((True,) * times + (False,)))

    def size(options: tuple[int, ...], by: int, divided: bool) -> int:
        """One of ``options`` that ``by`` divides (``divided``) or does not, if there is one."""
        fitting = [n for n in options if (n % by == 0) == divided]
        return draw(st.sampled_from(fitting or options))

    tp_divides, fsdp_divides = often(5), often(4)
    heads = k * draw(st.sampled_from(HEADS_PER_RANK)) if tp_divides else draw(st.sampled_from(HEADS))
    groups = [n for n in range(1, heads + 1) if heads % n == 0]  # key/value heads: they divide heads
    kv_heads = draw(st.sampled_from([n for n in groups if n % k == 0] if tp_divides else groups))
    # d_model 4 or more: a layer norm of 2 features gives +-1 whatever its input, so every gradient
    # before it is rounding noise (torch's own single device is 1.2e-12 from NumPy's there, measured
    # against the floor of ``cases.gradient_error``), not a number the plan could get wrong
    d_ks = [n for n in (D_K_ROTARY if base.positional == "rotary" else D_K) if heads * n >= 4]
    d_k = size(tuple(d_ks), f // math.gcd(f, heads), fsdp_divides)
    d_ff = k * size(D_FF_PER_RANK, f, not often(2)) if tp_divides else draw(st.sampled_from(D_FF))
    src_vocab, tgt_vocab = size(VOCABS, f, fsdp_divides), size(VOCABS, f, fsdp_divides)
    config = base.replace(
        d_model=heads * d_k,
        num_heads=heads,
        num_kv_heads=kv_heads,
        d_ff=d_ff,
        src_vocab_size=src_vocab,
        tgt_vocab_size=src_vocab if base.share_embeddings else tgt_vocab,  # one table: one vocabulary
        max_len=size(MAX_LENS, f, fsdp_divides),
        dropout=0.0,
    )
    return config, plan


def batch_for(config: Config, plan: Plan) -> dict[str, np.ndarray]:
    """Two rows per data device, right-padded to random lengths (each data rank's loss is weighed by
    its share of the targets), the same for the same pair."""
    rows = 2 * plan.data
    rng = np.random.default_rng([plan.data, config.tgt_vocab_size, config.pad_id])

    def ids(vocab: int, length: int) -> np.ndarray:
        out = rng.integers(0, vocab, (rows, length))
        out[out == config.pad_id] = (config.pad_id + 1) % vocab
        for row, real in enumerate(rng.integers(2, length + 1, rows)):  # >= 1 target in each row
            out[row, real:] = config.pad_id
        return out

    if config.kind == "decoder_only":
        return decoder_only_batch(ids(config.tgt_vocab_size, TGT_LEN + 1))
    return encoder_decoder_batch(ids(config.src_vocab_size, SRC_LEN), ids(config.tgt_vocab_size, TGT_LEN + 1))


def draw_sample(pairs: int = 300) -> list[tuple[Config, Plan]]:
    """The JAX and torch sample, from the first ``pairs`` drawn (derandomized: the same in every
    run). Hypothesis draws neighbours in a row, so the sample keeps one pair per outcome and plan,
    the one with the most weights (biases, gated feed-forward, untied output, learned positions:
    the most to split): SAMPLE["runs"] pairs that run, FSDP x tensor parallel's first, and
    SAMPLE["refused"] refused, those refused after tensor parallel's cut first. One layer a stack:
    compiling JAX's program and setting up each torch rank's modules is their time (NumPy's pairs
    have two)."""
    drawn: list[tuple[Config, Plan]] = []

    @settings(max_examples=pairs, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(sharded_cases())
    def collect(case):
        drawn.append(case)

    collect()
    chosen: dict[tuple, tuple[Config, Plan]] = {}
    for config, plan in drawn:
        outcome = uneven_split(config, plan)
        key = (outcome[0] if outcome else RUNS, plan)
        config = config.replace(num_encoder_layers=min(config.num_encoder_layers, 1),
                                num_decoder_layers=min(config.num_decoder_layers, 1))  # fmt: skip
        if key not in chosen or len(param_schema(config)) > len(param_schema(chosen[key][0])):
            chosen[key] = config, plan

    def order(key: tuple[str, Plan]) -> tuple[bool, ...]:
        outcome, plan = key
        return outcome != RUNS, outcome not in (RUNS, AFTER_TP), not (plan.fsdp > 1 and plan.tensor_parallel > 1)

    ranked = sorted(chosen, key=order)
    runs = [chosen[key] for key in ranked if key[0] == RUNS][: SAMPLE["runs"]]
    return runs + [chosen[key] for key in ranked if key[0] != RUNS][: SAMPLE["refused"]]


# ------------------------------------------------------------------------------ the expected outcome
def uneven_split(config: Config, plan: Plan) -> tuple[str, tuple[str, ...]] | None:
    """None if every weight splits evenly where every device's ``piece`` cuts it (and tensor
    parallel divides the heads and d_ff: a head is never cut), else (the outcome, the words the
    refusal must hold) for the first weight in the schema's order that does not, at the first
    uneven cut, tensor parallel's before FSDP's, as ``piece`` cuts."""
    k = plan.tensor_parallel
    for field in ("num_heads", "num_kv_heads", "d_ff"):
        if getattr(config, field) % k:
            return TP_SIZES, (f"tensor_parallel {k}", f"{field} {getattr(config, field)}")
    for name, shape in param_schema(config).items():
        where = placement(name, shape, plan)
        whole = np.zeros(shape)
        for t in range(k):
            tp_only = where._replace(fsdp_dim=None)
            try:
                part = piece(whole, tp_only, plan, 0, t)
            except ValueError:
                size = shape[where.model_dim]
                return TP_WEIGHT, (name, str(shape), f"tensor_parallel {k} does not divide {size}")
            for f in range(plan.fsdp):
                try:
                    piece(whole, where, plan, f, t)
                except ValueError:
                    outcome = AFTER_TP if where.fsdp_dim == where.model_dim else FSDP_WHOLE
                    words = [name, str(shape), f"fsdp {plan.fsdp} does not divide {part.shape[where.fsdp_dim]}"]
                    if outcome == AFTER_TP:
                        words.append(f"after tensor_parallel {k} cut it to {part.shape}")
                    return outcome, tuple(words)
    return None


def check_refusal(message: str, config: Config, plan: Plan, words: tuple[str, ...]) -> None:
    """One line, check_plan's own, holding ``words``."""
    assert "\n" not in message, message
    with pytest.raises(ValueError) as error:
        check_plan(config, plan)
    assert message == str(error.value)
    for word in words:
        assert word in message, f"{config} {plan}: {message!r} does not name {word!r}"


def check_against_one_device(config: Config, plan: Plan, loss: float, grads: dict[str, np.ndarray]) -> None:
    """The loss within 1e-12 relative, and each gradient within 1e-12 of its scale
    (``cases.gradient_error``), of NumPy's single device on the same weights and batch."""
    import numpy_impl

    model = numpy_impl.build_model(config, params_of(config, "float64"))
    want_loss, want = numpy_impl.loss_and_grads(model, batch_for(config, plan))
    assert abs(loss - want_loss) / want_loss <= TOLERANCE["float64"], f"{config} {plan}: loss {loss} != {want_loss}"
    error = gradient_error(grads, want, "float64")
    assert error <= TOLERANCE["float64"], f"{config} {plan}: gradients differ by {error:.2e}"


# ------------------------------------------------------------------------------ NumPy: 200 pairs
def test_a_random_plan_is_refused_naming_the_weight_and_sizes_or_runs_to_one_devices_numbers():
    import numpy_impl
    from numpy_impl.sharding import sharded_loss_and_grads

    outcomes = collections.Counter()

    @hypothesis_settings(NUMPY_PAIRS)
    @given(sharded_cases())
    def check(case):
        config, plan = case
        expected = uneven_split(config, plan)
        model = numpy_impl.build_model(config, params_of(config, "float64"))
        batch = batch_for(config, plan)
        if expected is None:
            loss, grads = sharded_loss_and_grads(model, batch, plan)
            check_against_one_device(config, plan, loss, grads)
        else:
            with pytest.raises(ValueError) as error:
                sharded_loss_and_grads(model, batch, plan)
            check_refusal(str(error.value), config, plan, expected[1])
        outcomes[expected[0] if expected else RUNS] += 1

    check()
    assert sum(outcomes.values()) >= NUMPY_PAIRS, outcomes
    # the draws reach every outcome, the refusals after tensor parallel's cut among them
    assert outcomes[RUNS] >= 60 and outcomes[AFTER_TP] >= 20 and outcomes[FSDP_WHOLE] >= 10, outcomes
    assert outcomes[TP_SIZES] >= 5, outcomes


def test_check_plan_accepts_a_plan_exactly_when_every_devices_piece_of_every_weight_exists():
    """Every kind, the encoder too (it has no loss to shard, but its weights are placed the same:
    the token-type table, the pooler): check_plan refuses what ``piece`` cannot cut, naming the
    weight and the sizes, and accepts what it can. No run: 300 pairs in a second or two."""
    outcomes, kinds = collections.Counter(), collections.Counter()

    @hypothesis_settings(300)
    @given(sharded_cases(KINDS + ("encoder_only",)))
    def check(case):
        config, plan = case
        expected = uneven_split(config, plan)
        if expected is None:
            check_plan(config, plan)
        else:
            with pytest.raises(ValueError) as error:
                check_plan(config, plan)
            check_refusal(str(error.value), config, plan, expected[1])
        outcomes[expected[0] if expected else RUNS] += 1
        kinds[config.kind] += 1

    check()
    assert outcomes[RUNS] >= 100 and outcomes[AFTER_TP] >= 20 and kinds["encoder_only"] >= 50, (outcomes, kinds)


# ------------------------------------------------------------------------------ JAX's and torch's sample
def write_records(path: pathlib.Path, records: list[dict], arrays: dict[str, np.ndarray]) -> None:
    """Each pair's config, plan and refusal (or None) to PATH.json; its loss and gradients to PATH.npz."""
    np.savez(path.with_suffix(".npz"), **arrays)
    path.with_suffix(".json").write_text(json.dumps(records))


def record(index: int, config: Config, plan: Plan, model, sharded_loss_and_grads) -> tuple[dict, dict]:
    """The backend's ``sharded_loss_and_grads`` on the pair: (its config, plan and refusal (or None),
    {index/loss, index/grad/NAME: arrays}), what the parent checks."""
    entry = {"config": config.to_json(), "plan": [plan.data_parallel, plan.fsdp, plan.tensor_parallel]}
    try:
        loss, grads = sharded_loss_and_grads(model, batch_for(config, plan), plan)
    except ValueError as error:
        return entry | {"refused": str(error)}, {}
    arrays = {f"{index}/grad/{name}": np.asarray(grad) for name, grad in grads.items()}
    return entry | {"refused": None}, arrays | {f"{index}/loss": np.array(float(loss))}


def jax_child(folder: str) -> None:
    """On 8 simulated CPU devices (processes.py sets XLA_FLAGS): every pair of the sample through
    JAX's sharded_loss_and_grads. Writes FOLDER/random-plans-jax.{json,npz}."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax_impl
    from jax_impl.sharding import sharded_loss_and_grads

    records, arrays = [], {}
    for index, (config, plan) in enumerate(draw_sample()):
        model = jax_impl.build_model(config, params_of(config, "float64"))
        entry, got = record(index, config, plan, model, sharded_loss_and_grads)
        records.append(entry)
        arrays |= got
    write_records(pathlib.Path(folder) / "random-plans-jax", records, arrays)


def torch_rank(size: int, rank: int, cases: list, out: str, init_file: str) -> None:
    """Rank ``rank`` of a gloo group of ``size`` processes: every pair of ``cases`` [(index, config,
    plan)] (all plans of ``size`` devices); rank 0 writes their losses and gradients to ``out``."""
    import datetime

    import torch
    import torch.distributed as dist

    import torch_impl
    from torch_impl.sharding import sharded_loss_and_grads

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT))  # fmt: skip
    records, arrays = [], {}
    for index, config, plan in cases:
        model = torch_impl.build_model(config, params_of(config, "float64"))
        entry, got = record(index, config, plan, model, sharded_loss_and_grads)
        records.append(entry | {"index": index})
        arrays |= got
    if rank == 0:
        write_records(pathlib.Path(out), records, arrays)
    dist.barrier()
    dist.destroy_process_group()


def torch_launcher(folder: str) -> None:
    """The sample in torch: the pairs check_plan refuses through sharded_loss_and_grads here (it
    refuses before it starts a process); the others in groups of gloo ranks, one group per number
    of devices, each rank forked from this process, which has imported torch (test_torch_sharding.py's
    ``launch``). Writes FOLDER/random-plans-torch.{json,npz}; exits with each failed rank's status."""

    import torch_impl
    from torch_impl.sharding import sharded_loss_and_grads

    records, arrays, groups, failed = [], {}, collections.defaultdict(list), []
    for index, (config, plan) in enumerate(draw_sample()):
        try:
            check_plan(config, plan)
        except ValueError:
            model = torch_impl.build_model(config, params_of(config, "float64"))
            entry, got = record(index, config, plan, model, sharded_loss_and_grads)
            records.append(entry | {"index": index})
            continue
        groups[plan.devices].append((index, config, plan))
    for size, cases in sorted(groups.items()):
        out = pathlib.Path(folder) / f"random-plans-torch-{size}"
        failed += run_group(torch_rank, [(size, rank, cases, str(out), f"{out}.rendezvous") for rank in range(size)])
        if not failed:
            records += json.loads(out.with_suffix(".json").read_text())
            arrays |= dict(np.load(out.with_suffix(".npz")))
    if failed:
        sys.exit("\n".join(failed))
    records.sort(key=lambda entry: entry.pop("index"))
    write_records(pathlib.Path(folder) / "random-plans-torch", records, arrays)


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_a_sample_of_random_plans_is_refused_with_check_plans_message_or_runs_to_one_devices_numbers(
    sharded_runs, framework
):
    if not sharded_runs.available(f"random-plans-{framework}"):
        pytest.skip(f"{framework} is not installed")
    runs = sharded_runs[f"random-plans-{framework}"]
    runs.check()
    records = json.loads((runs.folder / f"random-plans-{framework}.json").read_text())
    arrays = dict(np.load(runs.folder / f"random-plans-{framework}.npz"))
    outcomes = collections.Counter()
    for index, entry in enumerate(records):
        config, plan = Config.from_json(entry["config"]), Plan(*entry["plan"])
        expected = uneven_split(config, plan)
        if expected is None:
            assert entry["refused"] is None, f"{framework} refused {config} {plan}: {entry['refused']}"
            grads = {name: arrays[f"{index}/grad/{name}"] for name in param_schema(config)}
            check_against_one_device(config, plan, float(arrays[f"{index}/loss"]), grads)
        else:
            assert entry["refused"] is not None, f"{framework} ran {config} {plan}, which splits unevenly"
            check_refusal(entry["refused"], config, plan, expected[1])
        outcomes[expected[0] if expected else RUNS] += 1
    assert len(records) >= 20 and outcomes[RUNS] >= SAMPLE["runs"] and outcomes[AFTER_TP] >= 4, outcomes


if __name__ == "__main__":  # python -m shared_tests.sharding.test_random_plans {jax,torch} FOLDER
    (jax_child if sys.argv[1] == "jax" else torch_launcher)(sys.argv[2])
