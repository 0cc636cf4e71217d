"""Contracts only torch.compile can break: the compiled forward pass equals the eager one, the
inputs are checked eagerly with the eager messages, a trace runs eagerly.

Each compilation costs tens of seconds on a small CPU (Inductor builds C++ with gcc), so the
compiled cases here are one; the float32 forward and the compiled training step, against eager
torch as their oracle, run in the oracles session (shared_tests/oracles/test_oracle_torch_eager.py).
conftest.py shares Inductor's cache across the run's workers."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_spec import Config, init_params
from transformer_spec.trace import recording

from .. import tolerances
from ..cases import VARIANTS, flatten_output, model_inputs
from ..tolerances import assert_close

torch = pytest.importorskip("torch", reason="the [torch] extra is not installed")
torch_impl = pytest.importorskip("torch_impl")

LM = Config.preset("tiny-lm", tgt_vocab_size=13, max_len=16)


@pytest.fixture(autouse=True)
def _only_when_torch_is_selected(request):
    selected = request.config.getoption("--backend")
    if selected and "torch" not in selected:
        pytest.skip("torch not selected with --backend")
    tolerances.current_backend["name"] = "torch"


@pytest.mark.parametrize("dtype", ["float64"])  # float32: the oracles session (compiling is slow)
def test_compiled_forward_equals_eager_forward(dtype):
    """A padded encoder-decoder batch (masks, cross-attention, the fused kernels) through
    ``compiled(model)`` and through the model, asking for the attention weights and not the hidden
    states (``compiled`` passes each flag on by its name): every output, float64 to 1e-12 (float32
    logits to 1e-5: shared_tests/oracles/test_oracle_torch_eager.py)."""
    config = VARIANTS["pre-gelu-learned"]
    model = torch_impl.build_model(config, init_params(config, seed=4, dtype=dtype, nonzero_biases=True))
    src, tgt = (torch.from_numpy(x) for x in model_inputs(config, (3, 11, 7, True)))
    with torch.no_grad():
        compiled = torch_impl.compiled(model)(src, tgt, return_attentions=True)
        eager = model(src, tgt, return_attentions=True)
    assert compiled.hidden_states == () and len(compiled.attentions) == config.num_decoder_layers
    compiled, eager = flatten_output(compiled), flatten_output(eager)
    assert compiled.keys() == eager.keys()
    for name in eager:
        assert_close(np.asarray(compiled[name]), np.asarray(eager[name]), dtype, f"compiled vs eager {name}")


@pytest.mark.parametrize(
    "bad_ids, error",
    [
        (np.array([[1, 2, 13]]), ValueError),  # an id past the vocabulary
        (np.array([[1.0, 2.0]]), TypeError),  # float ids
        (np.ones((1, 17), dtype=np.int64), ValueError),  # longer than max_len
    ],
)
def test_compiled_model_refuses_bad_inputs_eagerly_with_the_eager_message(bad_ids, error):
    """The checks run before anything is compiled, on the caller's tensors: the same error and
    message as the eager model's."""
    model = torch_impl.build_model(LM, init_params(LM, seed=5))
    with pytest.raises(error) as eager:
        model(torch.from_numpy(bad_ids))
    with pytest.raises(error) as compiled:
        torch_impl.compiled(model)(torch.from_numpy(bad_ids))
    assert str(compiled.value) == str(eager.value)


def test_a_trace_of_the_compiled_model_runs_eagerly_and_records_every_intermediate():
    """While a trace records, ``compiled(model)`` runs the eager model: a compiled graph has no
    intermediates to record. The same names and values as a trace of the model itself."""
    model = torch_impl.build_model(LM, init_params(LM, seed=5, dtype="float64"))
    ids = torch.from_numpy(model_inputs(LM, (2, 6, 0, True))[0])
    traces = []
    for run in (model, torch_impl.compiled(model)):
        with recording(torch_impl.named_modules(model)) as trace, torch.no_grad():
            run(ids)
        traces.append(trace)
    assert list(traces[1]) == list(traces[0]) and len(traces[0]) > 10
    for name, want in traces[0].items():
        np.testing.assert_array_equal(traces[1][name], want, err_msg=name)
