"""torch's thread count and the numbers it computes (``transformer-ref ... --threads N``).

Measured: torch training's loss curve depends on the thread count, in float32 visibly (the copy
task's last loss after 200 steps: 0.0235 with one thread, 0.0781 with two) and in float64 in
the last bit (a first difference of 1 ulp at step 6). The cause is one kernel: the backward of
torch's fused ``F.layer_norm`` sums the gradients of LayerNorm's weight and bias over the rows
in one partial sum per thread, then adds the partial sums: another thread count, another order
of addition. Every other gradient, and the forward, is bitwise the same; the written-out code
(fused kernels off) gives bitwise equal loss curves at any thread count, float32 included.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from transformer_cli.train import task_setup  # noqa: E402
from transformer_run.schedules import warmup_schedule  # noqa: E402
from transformer_spec import init_params  # noqa: E402


@pytest.fixture
def threads():
    """Set torch's thread count inside a test; the process's count is put back afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def gradients(dtype: str, fused: bool) -> tuple[dict[str, np.ndarray], float]:
    import torch_impl
    from torch_impl.loss import cross_entropy
    from torch_impl.train import split_batch

    config, batches, _ = task_setup("copy", 0)
    model = torch_impl.build_model(config, init_params(config, seed=0, dtype=dtype))
    inputs, targets = split_batch(config, batches[0])
    with torch_impl.kernels.fused_kernels(fused):
        logits = model(*(torch.as_tensor(x) for x in inputs)).logits  # (B, T, V)
        loss = cross_entropy(logits, torch.as_tensor(targets), config.pad_id, 0.0)
        loss.backward()
    return {name: p.grad.numpy().copy() for name, p in model.named_parameters()}, float(loss.detach())


def loss_curve(dtype: str, steps: int, fused: bool) -> list[float]:
    import torch_impl

    config, batches, _ = task_setup("copy", 0)
    model = torch_impl.build_model(config, init_params(config, seed=0, dtype=dtype))
    with torch_impl.kernels.fused_kernels(fused):
        return torch_impl.train(model, batches, steps, warmup_schedule(config.d_model, 200), seed=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_only_the_fused_layer_norms_weight_gradients_depend_on_the_thread_count(threads, dtype):
    results = {}
    for count in (1, 2):
        threads(count)
        results[count] = {fused: gradients(dtype, fused) for fused in (True, False)}
    for fused in (True, False):
        (one, loss_one), (two, loss_two) = results[1][fused], results[2][fused]
        assert loss_one == loss_two  # the forward: bit for bit
        differ = sorted(name for name in one if not np.array_equal(one[name], two[name]))
        if not fused:
            assert differ == [], differ  # the written-out code: every gradient bit for bit
        else:
            assert all(name.endswith(("norm.weight", "norm.bias")) for name in differ), differ
            for name in differ:  # a reordered sum: rounding-level differences only
                scale = np.abs(one[name]).max()
                assert np.abs(one[name] - two[name]).max() <= 64 * np.finfo(dtype).eps * scale, name


def test_written_out_float64_and_float32_loss_curves_are_identical_at_one_and_two_threads(threads):
    for dtype in ("float64", "float32"):
        curves = []
        for count in (1, 2):
            threads(count)
            curves.append(loss_curve(dtype, 8, fused=False))
        assert curves[0] == curves[1], dtype


def test_fused_float64_loss_curves_agree_to_rounding_at_one_and_two_threads(threads):
    curves = []
    for count in (1, 2):
        threads(count)
        curves.append(np.array(loss_curve("float64", 8, fused=True)))
    np.testing.assert_allclose(curves[0], curves[1], rtol=1e-12, atol=0)


def test_cli_threads_default_is_one_for_the_toy_models_and_zero_is_refused(threads, capsys):
    from transformer_cli.main import main
    from transformer_cli.threads import default_threads, usable_cores

    threads(2)
    assert main(["train", "--task", "next-word", "--backend", "torch", "--steps", "2"]) == 0
    assert "1 torch thread" in capsys.readouterr().out and torch.get_num_threads() == 1
    assert main(["train", "--task", "next-word", "--backend", "torch", "--steps", "2", "--threads", "2"]) == 0
    assert "2 torch threads" in capsys.readouterr().out and torch.get_num_threads() == 2
    assert default_threads(135_000_000) == usable_cores()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--threads", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "transformer-ref train: error: argument --threads: must be a positive integer, got '0' "
        "(see transformer-ref train --help)"
    ]
