"""torch.compile against eager torch as its oracle: the compiled forward pass in float32 and the
compiled training step (forward, loss, backward; Adam as it is) equal the eager ones.

Here rather than in the parity session because each compilation costs tens of seconds on a small
CPU (Inductor builds C++ with gcc); conftest.py shares Inductor's cache across the run's workers.
The float64 forward, the eager input checks and the trace: shared_tests/models/test_torch_compiled.py."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_spec import Config, init_params

from .. import tolerances
from ..cases import VARIANTS, model_inputs
from ..tolerances import assert_close

ORACLE = "torch eager"
torch = pytest.importorskip("torch", reason="the oracle is eager torch: install the [torch] extra")
torch_impl = pytest.importorskip("torch_impl")

LM = Config.preset("tiny-lm", tgt_vocab_size=13, max_len=16)


@pytest.fixture(autouse=True)
def _oracle():
    tolerances.current_backend.update(name="torch", oracle=ORACLE)


def test_compiled_forward_equals_eager_forward_in_float32():
    """A padded encoder-decoder batch through ``compiled(model)`` and through the model: float32
    to 1e-5 of the largest logit."""
    config = VARIANTS["pre-gelu-learned"]
    model = torch_impl.build_model(config, init_params(config, seed=4, dtype="float32", nonzero_biases=True))
    src, tgt = (torch.from_numpy(x) for x in model_inputs(config, (3, 11, 7, True)))
    with torch.no_grad():
        compiled = torch_impl.compiled(model)(src, tgt).logits
        eager = model(src, tgt).logits
    assert_close(compiled.numpy(), eager.numpy(), "float32", "compiled vs eager logits")


def test_compiled_training_steps_equal_eager_steps():
    """Two Adam steps of a float64 LM, the forward, loss and backward compiled, against two
    eager steps from the same weights: the losses and every weight after them to 1e-12.

    Without attention biases: the key projection's bias has a true gradient of zero (softmax
    ignores a shift of every score), so two runs' gradients there are rounding noise, which Adam
    turns into steps of about lr * noise / eps (measured: 2.5e-10 of the largest weight)."""
    config = LM.replace(attention_bias=False)
    params = init_params(config, seed=5, dtype="float64", nonzero_biases=True)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(1, config.tgt_vocab_size, size=(2, 10)) for _ in range(2)]
    batches = [{"ids": ids[:, :-1], "targets": ids[:, 1:]} for ids in sequences]  # the next token
    runs = {}
    for compiled_step in (False, True):
        model = torch_impl.build_model(config, params)
        losses = torch_impl.train(model, batches, 2, lambda t: 1e-2, compiled_step=compiled_step)
        runs[compiled_step] = losses, torch_impl.to_params(model)
    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = runs[False], runs[True]
    assert_close(np.array(compiled_losses), np.array(eager_losses), "float64", "compiled vs eager losses")
    assert eager_weights.keys() == compiled_weights.keys()
    for name, want in eager_weights.items():
        assert_close(compiled_weights[name], want, "float64", f"compiled vs eager {name} after 2 steps")
    assert not np.array_equal(eager_weights["decoder.layers.0.self_attn.w_q.weight"], params[
        "decoder.layers.0.self_attn.w_q.weight"])  # the steps did change the weights


def test_compiled_decoding_steps_equal_eager_steps():
    """Cached decoding with the decoder and the output projection compiled (``compile_layers``):
    a float64 LM's prompt and five steps (the cache growing by one position each) give the eager
    stepper's logits to 1e-12, step by step."""
    from torch_impl.compiled import compile_layers

    params = init_params(LM, seed=6, dtype="float64", nonzero_biases=True)
    prompt = np.random.default_rng(1).integers(3, LM.tgt_vocab_size, size=(2, 4))
    steppers = [torch_impl.make_stepper(torch_impl.build_model(LM, params)),
                torch_impl.make_stepper(compile_layers(torch_impl.build_model(LM, params)))]  # fmt: skip
    states = [stepper.start(prompt, 5) for stepper in steppers]
    tokens = np.array([1, 2])
    for position in range(5):
        eager, states[0] = steppers[0].step(states[0], tokens, position)  # (N, V), ...
        compiled, states[1] = steppers[1].step(states[1], tokens, position)  # (N, V), ...
        assert_close(compiled, eager, "float64", f"compiled vs eager logits at step {position}")
        tokens = eager.argmax(-1)  # greedy, the same tokens fed to both
