"""Convolutions whose weight (or bias) the model computes (fusetune/computed_weights.py): weight norm as a
parametrization and as the old pre-hook, pruning masks, a user's parametrizations, functional convolutions on
computed tensors. The fused chain's producer weight is a derivation of the user's tensors, computed again at every
call and at load_tuned: after an in-place edit or a load_state_dict, what the kernels read is the model's weight
now. Parametrizations that compute otherwise in training mode, and hooks of unknown rules, stay the user's."""
from __future__ import annotations

import copy
import functools
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.nn.utils import prune

from fusetune.computed_weights import hook_derivations, hook_tensors
from fusetune.importer import _is_convolution, find_chains, import_model, trace
from fusetune.optimizer import fused_chains, optimize
from fusetune.search import Machine

from conftest import import_file
from fake_handlers import MACHINE_FIELDS, FakeBench

MODELS = Path(__file__).resolve().parent / "models"
#: The model files whose every chain's convolution computes its weight (or bias).
COMPUTED = ["wn_parametrized_conv1d", "wn_hook_conv", "computed_weight_functional", "wn_export_chunks"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("computed-weights-cache")


def _model(stem: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    module = import_file(MODELS / f"{stem}.py")
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # torch.nn.utils.weight_norm is deprecated (the old form is the point)
        warnings.simplefilter("ignore", FutureWarning)
        model = module.Model(*module.get_init_inputs()).eval()
    return model, tuple(module.get_inputs())


def _tensor(model: nn.Module, path: str) -> torch.Tensor:
    return functools.reduce(getattr, path.split("."), model)


def _edit(model: nn.Module, paths: set[str]) -> None:
    """Change every tensor a computed weight reads, in place (as an optimizer step does)."""
    with torch.no_grad():
        for path in sorted(paths):
            tensor = _tensor(model, path)
            tensor.mul_(torch.rand_like(tensor) + 0.5)


def _weights_now(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """Each convolution's weight as the model computes it now, by the node of a fresh trace: the weight argument's
    value of a functional (or traced-into parametrized) convolution, a hooked module's ``weight`` after a call."""
    with torch.no_grad():
        model(*inputs)  # a pre-hook computes module.weight at the call
    gm, values = _traced_values(model, inputs)
    out = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            out[node.name] = getattr(gm.get_submodule(node.target), "weight", None)
        elif _is_convolution(gm, node):
            out[node.name] = values[node.args[1].name]
    return out


@pytest.mark.parametrize("stem", COMPUTED + ["wn_user_parametrizations", "tcn_temporal_block"])
def test_the_kernels_weight_follows_the_users_tensors(stem: str, cache_dir: Path) -> None:
    """optimize on the CPU (the fake search): each chain's kernels read the weight the model computes now, as
    imported, after an in-place edit of every tensor it is computed from, and after load_state_dict of another
    model's; the generated model's forward on those tensors is the user's ops' value in float64."""
    model, inputs = _model(stem)
    opt = optimize(model, inputs, cache_dir=cache_dir, trials=2, benchmarker=FakeBench().factory,
                   machine=Machine(*MACHINE_FIELDS))
    chains = list(fused_chains(opt))
    computed = [c for c in chains if any(k.startswith("producer.") for k, _ in c.state.derived)]
    assert chains and all(c.kernel_model is not None for c in chains)
    assert len(computed) == (len(chains) if stem in COMPUTED else 1 if stem == "wn_user_parametrizations" else 2)
    reads = {path for c in computed for _, how in c.state.derived for path in how.reads}
    other, _ = _model(stem, seed=1)
    model.double()
    other.double()
    x = tuple(t.double() for t in inputs)
    for step in ("as imported", "edited in place", "load_state_dict"):
        if step == "edited in place":
            _edit(model, reads)
        elif step == "load_state_dict":
            model.load_state_dict(other.state_dict())
        with torch.no_grad():
            assert torch.equal(opt(*x), model(*x)), step  # the eager path (a CPU tensor), on the user's tensors
        weights = _weights_now(model, x)
        for chain in computed:
            chain._bind_tensors()  # as each kernel call binds them
            kernel_weight = chain.kernel_model.producer.weight
            assert kernel_weight.dtype == torch.float64
            torch.testing.assert_close(kernel_weight, weights[_producer(chain)], rtol=1e-14, atol=1e-15)
            shape = next(iter(chain.shapes))
            y = torch.randn(*shape, dtype=torch.float64)
            reference = type(chain.kernel_model).__mro__[1]  # the generated Model, on what the kernels read
            with torch.no_grad():
                torch.testing.assert_close(reference.forward(chain.kernel_model, y), chain.reference(y),
                                           rtol=1e-12, atol=1e-12)


def _producer(chain) -> str:
    """The name of the chain's convolution node (the reference graph keeps the model's node names)."""
    nodes = chain.state.reference.graph.nodes
    return next(n.name for n in nodes if _is_convolution(chain.state.reference, n))


def test_parametrizations_that_compute_otherwise_in_training_mode_stay_the_users(cache_dir: Path) -> None:
    """A parametrization writing a buffer in training mode, and spectral_norm's (power iteration on u and v), are
    not traced into: the convolution stays the user's module, refused with that reason; in training mode the
    optimized model updates the buffers as the model does."""
    model, inputs = _model("wn_user_parametrizations")
    _, refused = find_chains(trace(copy.deepcopy(model), inputs))
    reasons = {no.node: no.reason for no in refused}
    assert "computes otherwise in training mode (it reads self.training)" in reasons["b"]
    assert "spectral_norm's power iteration updates its u and v" in reasons["c"]
    exported, exported_inputs = _model("wn_export_chunks")  # torch.export traces through spectral_norm's (eval's)
    _, refused = find_chains(trace(copy.deepcopy(exported), exported_inputs))
    assert len(refused) == 2 and all("spectral_norm's power iteration" in no.reason for no in refused)
    twin = copy.deepcopy(model)
    opt = optimize(model, inputs, cache_dir=cache_dir, trials=2, benchmarker=FakeBench().factory,
                   machine=Machine(*MACHINE_FIELDS))
    assert {"b", "c"} <= {n.target for n in opt.graph.nodes if n.op == "call_module"}
    opt.train()
    twin.train()
    x = torch.randn_like(inputs[0])
    with torch.no_grad():
        torch.testing.assert_close(opt(x), twin(x), rtol=0, atol=0)
    ours, theirs = dict(model.named_buffers()), dict(twin.named_buffers())
    assert not torch.equal(ours["b.parametrizations.weight.0.scale"], torch.ones(()))  # it did run in training mode
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("stem", COMPUTED + ["wn_user_parametrizations"])
@pytest.mark.parametrize("given", ["model", "state_dict"])
def test_load_tuned_computes_the_weight_from_the_tensors_it_is_given(stem: str, given: str, tmp_path: Path) -> None:
    """load_tuned binds the computed weight from the user's model (or its state_dict, by the user's names) as it is
    when loaded: after an edit, a second load follows. On the CPU: the generated reference (float32), against the
    model's own value of the chain in float64."""
    from fusetune.cache import Cache
    from fusetune.deploy import load_tuned

    result = import_model(str(MODELS / f"{stem}.py"), tmp_path / "configs")
    model, inputs = _model(stem)
    model.double()
    x = tuple(t.double() for t in inputs)
    reads = {path for w in result.written for how in w.derived.values() for path in how.reads}
    for step in ("as imported", "edited"):
        if step == "edited":
            _edit(model, reads)
        values = _traced_values(model, x)[1]
        for written in result.written:
            with warnings.catch_warnings():  # no GPU: the reference, with the user's weights (warned)
                warnings.simplefilter("ignore")
                loaded = load_tuned(written.config, Cache(tmp_path / "cache"),
                                    weights=model if given == "model" else model.state_dict(), device="cpu")
            conv = written.chain.producer_node
            with torch.no_grad():
                out = loaded(values[_input_of(result.gm, conv)].float())
            torch.testing.assert_close(out.double(), values[written.chain.output_node], rtol=1e-5, atol=1e-5)


def _traced_values(model: nn.Module, inputs: tuple[torch.Tensor, ...]
                   ) -> tuple[torch.fx.GraphModule, dict[str, torch.Tensor]]:
    """A fresh trace of a copy of the model (a hook's computed weight shared) and every node's value on ``inputs``."""
    gm = trace(copy.deepcopy(model, hook_tensors(model)), inputs)
    values: dict[str, torch.Tensor] = {}

    class Keep(torch.fx.Interpreter):
        def run_node(self, n):
            values[n.name] = out = super().run_node(n)
            return out
    with torch.no_grad():
        Keep(gm).run(*inputs)
    return gm, values


def _input_of(gm: torch.fx.GraphModule, producer: str) -> str:
    from fusetune.importer import match_producer

    node = next(n for n in gm.graph.nodes if n.name == producer)
    return match_producer(gm, node).input.name


class _Halves(prune.BasePruningMethod):
    """A pruning method of its own mask rule but torch's apply_mask: a known hook."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        mask = default_mask.clone()
        mask.view(-1)[::2] = 0
        return mask


class _Scaled(_Halves):
    """A pruning method that applies its mask otherwise: an unknown rule."""

    def apply_mask(self, module):
        return super().apply_mask(module) * 2


@pytest.mark.parametrize("make, known", [
    (lambda c: torch.nn.utils.weight_norm(c, dim=1), True),
    (lambda c: prune.ln_structured(c, "weight", amount=0.5, n=2, dim=0), True),
    (lambda c: _Halves.apply(c, "weight"), True),
    (lambda c: _Scaled.apply(c, "weight"), False),
    (lambda c: torch.nn.utils.spectral_norm(c), False),
    (lambda c: c.register_forward_pre_hook(lambda m, args: None), False),
    (lambda c: (prune.l1_unstructured(c, "weight", amount=0.3), c.register_forward_hook(lambda m, a, o: None)), False),
])
def test_hooks_of_known_rules_are_derivations(make, known: bool) -> None:
    """The old weight_norm and torch's pruning (any mask rule, torch's apply_mask) compute the weight by a known
    rule, replayed from the module's tensors to exactly the weight the hook computes; any other hook, or a forward
    hook beside them, is refused (None)."""
    conv = nn.Conv2d(3, 4, 3).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        make(conv)
    found = hook_derivations(conv, "conv")
    assert (found is not None) == known
    if not known:
        return
    with torch.no_grad():
        for tensor in [t for n, t in conv.named_parameters() if n != "bias"]:
            tensor.mul_(torch.rand_like(tensor) + 0.5)  # the hook's inputs change: the derivation follows
        conv(torch.randn(1, 3, 5, 5, dtype=torch.float64))  # the hook computes conv.weight
    root = nn.Module()
    root.conv = conv
    value = found["producer.weight"].compute(lambda path: _tensor(root, path))
    torch.testing.assert_close(value, conv.weight, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("stem", COMPUTED + ["wn_user_parametrizations"])
def test_the_kernels_compute_with_the_weight_the_model_computes_on_a_gpu(stem: str, tmp_path: Path) -> None:
    """On a GPU, every chain on its kernels: as close to float64 as eager, and still after every tensor a computed
    weight reads changes in place, twice (the kernels read the weight computed at that call: the second call of a
    signature captures a CUDA graph, the third replays it, and the replay computes the weight again)."""
    from test_optimize import optimized_on_gpu

    model, inputs = _model(stem)
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    opt = optimized_on_gpu(model, inputs, tmp_path)
    chains = list(fused_chains(opt))
    assert chains and all(c.kernel_model is not None for c in chains)
    reads = {path for c in chains for _, how in c.state.derived for path in how.reads}
    for step in ("as tuned", "edited in place", "edited again"):
        if step != "as tuned":
            _edit(model, reads)
        for chain in chains:
            chain.kernel_calls = 0
        with torch.no_grad():
            exact = copy.deepcopy(model, hook_tensors(model)).double()(*(x.double() for x in inputs))
            want, got = model(*inputs), opt(*inputs)
            # eager's error in the other layout too, as verification takes it (a channels-last winner may carry it)
            last = model(*(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs))

        def error(y: torch.Tensor) -> float:
            return ((y.double() - exact).norm() / exact.norm()).item()
        print(f"\n{stem} {step}: error vs float64: eager {error(want):.2e} (channels last {error(last):.2e}), "
              f"optimized {error(got):.2e}")
        assert all(c.kernel_calls == 1 for c in chains), step
        assert error(got) <= max(8 * error(want), 8 * error(last), 1e-5), step


def test_every_form_of_an_in_place_write_marks_its_buffer() -> None:
    """A buffer the forward writes (a method ending in ``_`` on a torch function's view or an index, ``out=``,
    ``inplace=True``) is written_in_place, so no derivation replays it; a buffer only read, the input of an ``out=`` call
    among them, is not."""
    from fusetune.derived import written_in_place

    module = import_file(Path(__file__).resolve().parent / "in_place_writes" / "buffer_writes_every_form.py")
    model = module.Model()
    buffers = {name for name, _ in model.named_buffers()}
    assert written_in_place(trace(model, module.get_inputs())) == {b for b in buffers if b.startswith("written_")}


def test_checking_a_trace_leaves_the_users_buffers_as_they_were_even_where_a_run_fails() -> None:
    """trace_differs runs the model and its trace from the buffers as they were and puts them back after, also
    where the model's own run raises; a buffer the model returns is compared as that run left it."""
    from fusetune.importer import trace_differs

    module = import_file(Path(__file__).resolve().parent / "in_place_writes" / "writes_then_fails.py")
    model = module.Model()
    inputs = module.get_inputs()
    gm = trace(model, inputs)
    model.steps.fill_(5)
    assert trace_differs(model, gm, inputs) is None
    assert model.steps.item() == 5
    wide = [torch.randn(2, 3, 8, 9)]
    assert "own forward fails" in trace_differs(model, gm, wide)
    assert model.steps.item() == 5
