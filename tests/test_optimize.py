"""``fusetune.optimize``: chains found and replaced, the user's tensors shared, the model's output kept,
training mode and autograd on the eager path, untuned shapes said once. CPU tests drive the search with
the fake benchmarker; the GPU tests (marked gpu) optimize torchvision's resnet18 and resnet50 for real."""
from __future__ import annotations

import contextlib

import copy
import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch

import fusetune
from fusetune.cache import Cache
from fusetune.importer import example_arguments
from fusetune.optimizer import FusedChain, fused_chains, optimize
from fusetune.search import Machine
from fusetune.worlds import WORLDS

from conftest import import_file, restore_tf32_state, tf32_state
from fake_handlers import MACHINE_FIELDS, FakeBench, fake_time

MODELS = Path(__file__).resolve().parent / "models"
MACHINE = Machine(*MACHINE_FIELDS)
TRIALS = 2


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One cache for the module: a model optimized twice is searched once (the second reads the cache)."""
    return tmp_path_factory.mktemp("optimize-cache")


#: The fourth sweep's model files (tests/models/sweep4_*.py) that have chains.
SWEEP4 = ["sweep4_kb_convt3d_mean_add_softmax_tanh_scaling", "sweep4_kb_convt3d_sum_layernorm_avgpool_gelu",
          "sweep4_kb_convt2d_min_sum_gelu_add", "sweep4_kb_convt3d_logsumexp_sigmoid_swish_sub_clamp_max",
          "sweep4_kb_convt2d_gap_bias_logsumexp_sum_mul", "sweep4_kb_conv2d_avgpool_sigmoid_sum_all",
          "sweep4_kb_convt3d_leaky_mul_leaky_maxpool", "sweep4_kb_convt3d_maxpool_softmax_sub_swish_max",
          "sweep4_shared_conv_twice", "sweep4_std_conv_weight_standardization",
          "sweep4_masked_fill_nan_to_num_clamp_methods", "sweep4_padding_same_and_modes", "sweep4_lazy_modules",
          "sweep4_channels_last_model", "sweep4_patch_embed_tokens", "sweep4_pixel_shuffle_sr",
          "sweep4_identity_pos_embed_quickgelu", "sweep4_checkpoint_autocast_no_grad",
          "sweep4_pool_options_indices_near_misses", "sweep4_timm_conv2d_same_conv_forward",
          "sweep4_inplace_view_writes"]  # not sweep4_spectral_norm_buffer_writes: each call writes its state
#: Model files whose convolution's output an op outside the chain reads before the chain's last value: each such
#: chain cut before that read, returning the output too (importer.chains._cut_before_early_readers).
EARLY_READERS = ["returns_conv_near_misses", "early_reader_cut_chain", "early_reader_consumed_by_chain",
                 "early_reader_no_step_kept"]


def _model(stem: str):
    module = import_file(MODELS / f"{stem}.py")
    torch.manual_seed(0)
    return module.Model(*module.get_init_inputs()), example_arguments(module.get_inputs())


def _optimize(model, inputs, cache_dir: Path) -> torch.nn.Module:
    return optimize(model, inputs, cache_dir=cache_dir, trials=TRIALS, benchmarker=FakeBench().factory,
                    machine=MACHINE)


def test_optimize_is_exported() -> None:
    assert fusetune.optimize is optimize


def test_chains_are_replaced_and_share_the_users_tensors(cache_dir: Path, caplog) -> None:
    model, inputs = _model("two_chains_matmul")
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    opt = _optimize(model, inputs, cache_dir)
    took = [r.getMessage() for r in caplog.records if " took " in r.getMessage()]  # where a start's time goes
    assert len(took) == 1 and all(f"{phase} " in took[0] for phase in ("trace", "cache and search",
                                                                        "kernels bound and loaded")), took
    chains = list(fused_chains(opt))
    assert len(chains) == 2 and all(c.kernel_model is not None for c in chains)
    calls = [n for n in opt.graph.nodes if n.op in ("call_module", "call_function")]
    assert [n.target for n in calls if n.op == "call_module"] == [f"fused_{c.name}" for c in chains]
    assert not any(getattr(n.target, "__name__", "") in ("conv2d", "tanh", "abs") for n in calls)
    first, second = (c.kernel_model for c in chains)
    assert first.producer.weight is model.conv.weight and first.producer.bias is model.conv.bias
    assert second.producer.weight is model.weight and second.producer.bias is model.b  # a functional conv2d
    ours, theirs = opt.state_dict(), model.state_dict()
    assert set(ours) == set(theirs)  # the user's names, nothing of the fused modules
    assert all(ours[k].data_ptr() == theirs[k].data_ptr() for k in theirs)
    with torch.no_grad():
        model.weight.mul_(2)  # a change to the user's model is the optimized one's
    with torch.no_grad():
        assert torch.equal(opt(*inputs), model(*inputs))


def test_only_the_winners_are_built_unless_the_search_built_every_variant(cache_dir: Path) -> None:
    from fusetune.build import BUILD_STAMP, BUILT_MARKER
    from fusetune.cache import Cache
    from fusetune.winners import software_fields
    from fusetune.codegen import render
    from fusetune.plan import make_plan

    model, inputs = _model("conv2d_groupnorm_scale_clamp")
    model.eval()
    chain = next(fused_chains(_optimize(model, inputs, cache_dir)))
    full = render(make_plan(chain.state.spec))
    assert chain.state.rendered.name != full.name  # the winner's variants alone: a fresh machine builds little
    assert len(chain.state.rendered.cuda_sources) < len(full.cuda_sources)  # one unit per winner, not per variant
    built = Cache(cache_dir).build_dir(f"{full.name}-sm{MACHINE.capability.replace('.', '')}")
    built.mkdir(parents=True, exist_ok=True)
    (built / BUILT_MARKER).write_text("1\n")  # as the search leaves it on the machine that tuned
    (built / BUILD_STAMP).write_text(json.dumps({"arch": MACHINE.capability, **software_fields()}))
    try:
        chain = next(fused_chains(_optimize(model, inputs, cache_dir)))
        assert chain.state.rendered.name == full.name  # nothing to compile: the search's build is loaded
        (built / BUILD_STAMP).write_text(json.dumps({"arch": MACHINE.capability, **software_fields(),
                                                     "torch": "1.0.0"}))
        chain = next(fused_chains(_optimize(model, inputs, cache_dir)))
        assert chain.state.rendered.name != full.name  # built for another torch: the winners are built again
    finally:
        (built / BUILT_MARKER).unlink()
        (built / BUILD_STAMP).unlink()


@pytest.mark.parametrize("stem", ["conv2d_groupnorm_scale_clamp", "conv1d_batchnorm_eval", "convt2d_residual_clone",
                                  "kb_conv2d_shape_branch_export", "kb_conv2d_bias_view_in_forward",
                                  "kb_convt2d_tensor_operands_on_device", "kb_conv3d_spatial_softmax_views",
                                  "kb_conv2d_functional_norms", "kb_convt2d_add_input_hardswish", "resnet_blocks",
                                  "resnet_basicblock_downsample_after", "convnet_eval_dropouts_casts",
                                  "conv2d_reflect_instancenorm_relu",
                                  "inplace_and_pow_forms", "conv1d_keyword_calls", "kb_conv2d_derived_operands",
                                  "conv2d_ceil_mode_partial_windows", "mobilenetv2_inverted_residual", "dcgan",
                                  "yolo_c2f_csp", "fast_style_reflection_pads", "sweep_unet_up_output_size"])
def test_output_equals_the_models(stem: str, cache_dir: Path, caplog) -> None:
    model, inputs = _model(stem)
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    assert any(isinstance(m, FusedChain) for m in opt.modules())
    fresh = tuple(torch.randn_like(x) for x in inputs)
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    with torch.no_grad():
        assert torch.equal(opt(*fresh), model(*fresh))
    assert all(c.kernel_calls == 0 for c in fused_chains(opt))  # a CPU tensor: the eager path, and why
    assert any("input on cpu" in r.getMessage() for r in caplog.records)
    for name, tensor in model.named_parameters():  # and the parameters the chain reads are the user's
        assert opt.get_parameter(name) is tensor


@pytest.mark.parametrize("stem", ["two_chains_matmul", "conv2d_nested_buffer_shift", "conv1d_batchnorm_eval",
                                  "kb_conv2d_scale_bias_scalar_views", "kb_conv2d_shape_branch_export",
                                  "kb_conv2d_bias_view_in_forward", "kb_conv2d_functional_norms", "srresnet_prelu",
                                  "timm_batchnorm_act", "convnet_eval_dropouts_casts", "kb_conv2d_derived_operands",
                                  "yolo_c2f_csp", "fast_style_reflection_pads", "sweep_unet_up_output_size"])
def test_the_kernels_model_holds_the_users_tensors_where_its_reference_reads_them(stem: str, cache_dir: Path) -> None:
    """What the fused kernels read is bound right: the generated ModelNew's own reference forward, on the
    tensors bound to it, computes what the user's ops compute (the kernels themselves need a GPU)."""
    model, inputs = _model(stem)
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    for chain in fused_chains(opt):
        shape = next(iter(chain.shapes))
        x = torch.randn(*shape)
        extra = [torch.randn(*s) for s in chain.state.spec.input_shapes(shape)]  # a residual's identity
        chain._bind_tensors()  # as each kernel call binds them
        reference = type(chain.kernel_model).__mro__[1]  # the generated Model
        with torch.no_grad():
            assert torch.allclose(reference.forward(chain.kernel_model, x, *extra), chain.reference(x, *extra),
                                  rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stem", ["conv2d_nested_buffer_shift", "conv1d_batchnorm_eval"])
@pytest.mark.parametrize("moved", ["optimized", "user's"])
def test_moving_either_model_moves_both(stem: str, moved: str, cache_dir: Path) -> None:
    """``.to()`` swaps a parameter's data in place but replaces a buffer (batch norm's statistics, a
    registered shift) by a new tensor in the moved model alone: moving one model, and only that one,
    must leave both running, on the same tensors."""
    model, inputs = _model(stem)
    opt = _optimize(model, inputs, cache_dir)
    (opt if moved == "optimized" else model).to(torch.float64)
    x = inputs[0].double()
    with torch.no_grad():
        assert torch.equal(opt(x), model(x))
    assert all(t.dtype == torch.float64 for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())
    ours = {**dict(opt.named_parameters()), **dict(opt.named_buffers())}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        assert ours[name] is tensor, name
    for chain in fused_chains(opt):  # what the reference path and the kernels read
        for owner, attr in chain.state.tensors:
            assert getattr(owner, attr).dtype in (torch.float64, torch.int64)


def test_parameters_of_other_shapes_bind_as_views(cache_dir: Path) -> None:
    """A (1, C, 1, 1) bias is a per-channel parameter of the config, a 0-dim scale a scalar one: the kernels read
    views of the user's very storage, so an in-place update reaches them, and a move is followed."""
    model, inputs = _model("kb_conv2d_scale_bias_scalar_views")
    model.eval()
    chain = next(fused_chains(_optimize(model, inputs, cache_dir)))
    chain._bind_tensors()
    ours = chain.kernel_model
    assert ours.scale is model.scale  # (C, 1, 1) already: the tensor itself
    for name, shape in (("bias", (5, 1, 1)), ("alpha", ())):
        assert tuple(getattr(ours, name).shape) == shape, name
        assert getattr(ours, name).untyped_storage().data_ptr() == getattr(model, name).untyped_storage().data_ptr()
    with torch.no_grad():
        model.alpha.fill_(3.0)
    assert torch.equal(ours.alpha, torch.tensor(3.0))
    model.to(torch.float64)
    chain._bind_tensors()
    assert ours.alpha.dtype == torch.float64 and ours.bias.dtype == torch.float64
    x = inputs[0].double()
    reference = type(ours).__mro__[1]  # the generated Model's forward, on what the kernels read
    with torch.no_grad():
        assert torch.allclose(reference.forward(ours, x), model(x), rtol=1e-12, atol=1e-12)


def test_derived_operands_follow_the_users_tensors(cache_dir: Path) -> None:
    """Operands the forward computes from the model's tensors alone (a batch norm folded by hand, exp of a scale,
    sigmoid of a gate read by both chains) are parameters of the configs that each kernel call computes from the
    user's tensors as they are then: an in-place change of a buffer or a parameter, and a move, reach the kernels
    (nothing of them is a constant of the trace)."""
    model, inputs = _model("kb_conv2d_derived_operands")
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    chains = list(fused_chains(opt))
    assert len(chains) == 2 and all(dict(c.state.derived) for c in chains)
    assert not any(str(n.target).startswith("_tensor_constant") for n in opt.graph.nodes)
    reference = [type(c.kernel_model).__mro__[1] for c in chains]  # the generated Model: what the kernels compute
    with torch.no_grad():
        model.bn.running_var.mul_(3.0)
        model.bn.bias.add_(1.0)
        model.scale.fill_(-0.7)
        model.gate.mul_(-2.0)
    x = torch.randn_like(inputs[0])
    with torch.no_grad():
        assert torch.equal(opt(x), model(x))  # the reference path, after the change
        for dtype, tolerance in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
            model.to(dtype)
            assert torch.equal(opt(x.to(dtype)), model(x.to(dtype)))  # (a call takes the user's moved buffers)
            for chain, ref, expected in zip(chains, reference, model(x.to(dtype)).split(7, dim=1)):  # torch.cat's
                chain._bind_tensors()  # as each kernel call binds them
                out = ref.forward(chain.kernel_model, x.to(dtype))
                torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)


def test_modules_with_forward_hooks_stay_the_users(cache_dir: Path) -> None:
    """spectral_norm's pre-hook recomputes the convolution's weight from weight_orig at each call, and a user's forward
    hook records a feature map: neither module is a fused chain's op (the kernels would read a weight no hook
    recomputes, and never run the hook), so after weight_orig changes every chain's kernels still compute its ops."""
    model, inputs = _model("sngan_discriminator_hooks")
    opt = _optimize(model, inputs, cache_dir)
    chains = list(fused_chains(opt))
    assert len(chains) == 2
    assert {n.target for n in opt.graph.nodes if n.op == "call_module"} >= {"block.c1", "block.c2", "feat"}
    with torch.no_grad():
        model.block.c1.weight_orig.add_(torch.randn_like(model.block.c1.weight_orig))
        x = torch.randn_like(inputs[0])
        assert torch.equal(opt(x), model(x))
        for chain in chains:
            shape = next(iter(chain.shapes))
            x = torch.randn(*shape)
            chain._bind_tensors()
            reference = type(chain.kernel_model).__mro__[1]  # the generated Model, on the tensors the kernels read
            assert torch.allclose(reference.forward(chain.kernel_model, x), chain.reference(x), rtol=1e-5, atol=1e-6)


def test_untraceable_model_is_returned_unchanged(cache_dir: Path, caplog) -> None:
    """Control flow on tensor values: neither torch.fx nor torch.export traces it; the model itself comes back,
    with one warning saying why."""
    model, inputs = _model("untraceable")
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    assert _optimize(model, inputs, cache_dir) is model
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "torch.fx cannot trace" in warnings[0] and "nor can torch.export" in warnings[0]


def test_a_model_with_scripted_submodules_is_optimized_around_them(cache_dir: Path) -> None:
    """torch.jit.script'ed submodules (a ScriptModule's tensor tables are not dicts): no chain through them, and the
    optimized model runs them and computes the model's output (it raised a TypeError, sharing their tensors)."""
    model, inputs = _model("sweep_jit_script_submodule")
    opt = _optimize(model.eval(), inputs, cache_dir)
    fresh = tuple(torch.randn_like(x) for x in inputs)
    with torch.no_grad():
        assert torch.equal(opt(*fresh), model(*fresh))


def test_a_model_whose_trace_computes_something_else_is_returned_unchanged(cache_dir: Path, caplog) -> None:
    """``out = y; out += 1``: eager adds in place (y changes), torch.fx records a new tensor; a model built on that
    trace would return other values, and torch.export cannot trace this one (a parameter clamped through ``.data``).
    The model itself comes back, with one warning saying why."""
    model, inputs = _model("iadd_alias_with_data_clamp")
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    assert _optimize(model.eval(), inputs, cache_dir) is model
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "traced forward differs from its own" in warnings[0]
    assert "nor can torch.export trace it" in warnings[0]


@pytest.mark.parametrize("stem", ["inplace_write_on_an_alias", "sweep_iadd_alias"])
def test_a_model_torch_fx_traces_wrongly_is_optimized_on_torch_exports_trace(stem: str, cache_dir: Path,
                                                                            caplog) -> None:
    """``r = x; x *= 3.0``: torch.fx's trace computes something else (it records a new tensor), torch.export's
    records the write: optimize builds on that one, said once, and the optimized model computes the model's
    output, at the example's shapes (the trace) and at others (the model's own forward: export's is specialised)."""
    model, inputs = _model(stem)
    model.eval()
    caplog.set_level(logging.INFO, logger="fusetune.import")
    opt = _optimize(model, inputs, cache_dir)
    assert any(isinstance(m, FusedChain) for m in opt.modules())
    said = [r.getMessage() for r in caplog.records if "torch.export's trace computes the model's" in r.getMessage()]
    assert len(said) == 1 and "torch.fx's traced forward differs" in said[0]
    fresh = tuple(torch.randn_like(x) for x in inputs)
    other = tuple(torch.randn(x.shape[0] + 1, *x.shape[1:]) for x in inputs)
    with torch.no_grad():
        assert torch.equal(opt(*fresh), model(*fresh))
        assert torch.equal(opt(*other), model(*other))


def test_a_transposed_convolution_given_its_output_size_fuses_at_the_examples_shapes_alone(cache_dir: Path,
                                                                                            caplog) -> None:
    """U-Net's self.up(d, output_size=s.size()): the chain's output_padding is the example's (10 from 5 needs 1);
    a model input of 9 rows gives the chain the same 5 rows but asks 9 back (padding 0): there, and at any input
    shape but the example's, the model's own forward runs, said once; at the example the trace runs."""
    model, inputs = _model("sweep_unet_up_output_size")
    opt = _optimize(model.eval(), inputs, cache_dir)
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    other = torch.randn(2, 3, 9, 11)
    with torch.no_grad():
        assert torch.equal(opt(other), model(other)) and torch.equal(opt(other), model(other))
        assert torch.equal(opt(*inputs), model(*inputs))
    said = [r.getMessage() for r in caplog.records if "output size" in r.getMessage()]
    assert len(said) == 1 and "other than the example's" in said[0]


@pytest.mark.parametrize("stem", ["kb_conv2d_shape_branch_export", "yolo_c2f_csp"])
def test_a_model_only_torch_export_traces_runs_its_own_forward_at_other_shapes(stem: str, cache_dir: Path,
                                                                              caplog) -> None:
    """torch.export specialises its trace to the example's shapes (its guards fail at any other): there the
    optimized model runs the model's own forward, with the user's tensors, said once; at the example's shapes
    it runs the trace."""
    model, inputs = _model(stem)
    model.eval()
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    opt = _optimize(model, inputs, cache_dir)
    assert opt.__dict__.get("_specialised") is not None
    other = tuple(torch.randn(x.shape[0] + 1, *x.shape[1:]) for x in inputs)
    with torch.no_grad():
        assert torch.equal(opt(*inputs), model(*inputs))  # the trace (its chains' own ops on the CPU)
        for _ in range(2):
            assert torch.equal(opt(*other), model(*other))
        next(model.parameters()).mul_(1.5)  # the user's tensors, as they are now
        assert torch.equal(opt(*other), model(*other))
    said = [r for r in caplog.records if "traced by torch.export" in r.getMessage()]
    assert len(said) == 1


def test_training_mode_updates_the_users_running_statistics(cache_dir: Path, caplog) -> None:
    model, inputs = _model("convt3d_batchnorm_train_pools")
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    assert model.training
    twin = copy.deepcopy(model)
    opt = _optimize(model, inputs, cache_dir)
    assert opt.training and model.bn.training  # the user's modes, and tracing left the statistics alone
    assert torch.equal(model.bn.running_mean, twin.bn.running_mean)
    out = opt(*inputs)
    assert torch.equal(out, twin(*inputs))
    assert torch.equal(model.bn.running_mean, twin.bn.running_mean) and not torch.equal(
        model.bn.running_mean, torch.zeros_like(model.bn.running_mean))
    assert int(model.bn.num_batches_tracked) == 1
    assert all(c.kernel_calls == 0 for c in fused_chains(opt))
    assert any("training mode" in r.getMessage() for r in caplog.records)
    opt.eval()
    assert model.bn.training  # the copy's modes are its own
    with torch.no_grad():
        assert torch.equal(opt(*inputs), twin.eval()(*inputs))
    assert int(model.bn.num_batches_tracked) == 1  # eval mode reads the statistics, never moves them


def test_autograd_takes_the_eager_path_and_backward_works(cache_dir: Path, caplog) -> None:
    model, inputs = _model("conv2d_groupnorm_scale_clamp")
    model.eval()
    twin = copy.deepcopy(model)
    opt = _optimize(model, inputs, cache_dir)
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    for _ in range(3):
        opt(*inputs).sum().backward()
    twin(*inputs).sum().backward()
    assert torch.allclose(model.scale.grad, 3 * twin.scale.grad)
    said = [r.getMessage() for r in caplog.records if "autograd" in r.getMessage()]
    assert len(said) == 1 and "torch.no_grad()" in said[0]
    assert all(c.kernel_calls == 0 for c in fused_chains(opt))


def test_an_untuned_shape_runs_eagerly_and_is_said_once(cache_dir: Path, caplog) -> None:
    model, inputs = _model("conv2d_groupnorm_scale_clamp")
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    other = torch.randn(3, 3, 21, 17)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(opt(other), model(other))
    said = [r.getMessage() for r in caplog.records if "[3, 3, 21, 17]" in r.getMessage()]
    assert len(said) == 1 and "not tuned" in said[0]
    assert all(c.kernel_calls == 0 for c in fused_chains(opt))


def test_a_damaged_cache_entry_leaves_its_chain_eager_and_the_others_fused(tmp_path: Path, caplog) -> None:
    """One chain's trouble (here a cache entry whose winner has no variant) never aborts optimize."""
    from fusetune.cache import Cache

    model, inputs = _model("two_chains_matmul")
    _optimize(model, inputs, tmp_path)
    cache = Cache(tmp_path)
    entries = [e for e in cache.entries() if e.winner is not None]
    assert len(entries) == 2  # two problems, one entry each
    damaged = json.loads(cache.entry_path(entries[0].key).read_text())
    damaged["winner"] = {"time_ms": 1.0}  # no "variant"
    cache.entry_path(entries[0].key).write_text(json.dumps(damaged))
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    opt = _optimize(model, inputs, tmp_path)
    chains = list(fused_chains(opt))  # the damaged one keeps the model's own ops, the other is fused
    assert len(chains) == 1 and chains[0].kernel_model is not None
    assert any("not tuned: KeyError" in r.getMessage() for r in caplog.records)
    assert any("keeps the model's own ops" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        assert torch.equal(opt(*inputs), model(*inputs))


@contextlib.contextmanager
def _tf32_setting_restored():
    """torch's TF32 switches are process-wide properties (monkeypatch cannot undo a property set on
    an instance): save every one by the API this torch has and put them back by value."""
    saved = tf32_state(torch)
    try:
        yield
    finally:
        restore_tf32_state(saved)


@pytest.mark.parametrize("api", ["current", "legacy"])
def test_chains_are_tuned_at_the_users_tf32_setting(api: str, tmp_path: Path) -> None:
    """Where the user turned TF32 off, the kernels must not use it: the configs say precision ieee."""
    model, inputs = _model("conv2d_groupnorm_scale_clamp")
    model.eval()
    assert {c.state.spec.precision for c in fused_chains(_optimize(model, inputs, tmp_path))} == {"tf32"}
    conv = getattr(torch.backends.cudnn, "conv", None)
    new_api = conv is not None and hasattr(conv, "fp32_precision")
    with _tf32_setting_restored():
        if api == "legacy":
            if new_api:  # the legacy setter on a new torch: the new API reads 'none' after it
                conv.fp32_precision = "tf32"
            torch.backends.cudnn.allow_tf32 = False
        elif new_api:
            conv.fp32_precision = "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = False
        assert {c.state.spec.precision for c in fused_chains(_optimize(model, inputs, tmp_path))} == {"ieee"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_without_cuda_every_chain_is_eager_and_why_is_said_once(tmp_path: Path, caplog) -> None:
    model, inputs = _model("two_chains_cat")
    model.eval()
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    opt = optimize(model, inputs, cache_dir=tmp_path)
    with torch.no_grad():
        assert torch.equal(opt(*inputs), model(*inputs))
    said = [r for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "CUDA" in said[0].getMessage()
    assert not list(tmp_path.iterdir())  # nothing was tuned or cached


# -- real models on a GPU ----------------------------------------------------------------------------

#: Seconds of tuning per model in the GPU tests (each chain gets a share; cached chains none).
GPU_BUDGET_S = float(os.environ.get("FUSETUNE_TEST_BUDGET_S", "300"))


def _median_ms(fn, reps: int = 20) -> float:
    from fusetune.evaluate import median_ms

    return median_ms(fn, reps=reps, warmup=0)


class _NoEager:
    """The GPU benchmarker, with PyTorch's own forward (and torch.compile's of it) out of the running: the
    winner is a kernel, so that the test runs kernels even where eager or inductor would win at a small shape."""

    def __init__(self, bench) -> None:
        self.bench = bench

    def prepare(self) -> None:
        self.bench.prepare()

    def evaluate(self, candidate):
        if WORLDS[candidate.get("producer.impl", "cudnn")].runs_reference:  # eager, inductor: no kernels
            return {"status": "infeasible", "log": "the reference's forward left out by the test"}
        return self.bench.evaluate(candidate)

    def confirm(self, candidate):
        return self.bench.confirm(candidate)

    def eager_ms(self):
        return self.bench.eager_ms()


def optimized_on_gpu(model, inputs: tuple, tmp_path: Path, budget_s: float = 240, **kwargs) -> torch.nn.Module:
    """optimize with the GPU benchmarker, PyTorch's own forward left out of each search (_NoEager), so that every
    chain runs kernels, 4 trials a chain."""
    from fusetune.runner import GpuBenchmarker
    from fusetune.worker import Worker

    machine = Machine.detect()
    with Worker() as worker:
        def factory(plan, shape):
            return _NoEager(GpuBenchmarker(plan, shape, Cache(tmp_path), machine, worker, echo=print))
        return optimize(model, inputs, budget_s=budget_s, trials=4, cache_dir=tmp_path, benchmarker=factory,
                        machine=machine, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("stem", ["conv2d_nested_buffer_shift", "two_chains_matmul", "kb_conv2d_scale_bias_scalar_views",
                                  "kb_conv2d_bias_view_in_forward", "kb_convt2d_add_input_hardswish", "resnet_blocks",
                                  "resnet_basicblock_downsample_after",
                                  "kb_conv2d_min_channels_scalar_bias", "kb_convt2d_subtract_mean_tanh",
                                  "srresnet_prelu", "sr_upsampler_prelu_leaky", "inplace_and_pow_forms",
                                  "timm_batchnorm_act",
                                  "conv2d_reflect_instancenorm_relu", "kb_conv2d_derived_operands",
                                  "conv2d_ceil_mode_partial_windows", "mobilenetv2_inverted_residual",
                                  "yolo_c2f_csp", "gated_forms", "tcn_causal_chomp",
                                  "sweep_conv2d_where_clamp_tensors", "sweep_conv2d_inplace_param_ops_tuple_out",
                                  "sweep_conv2d_spatial_views_mean", "sweep_conv2d_negative_dims",
                                  "sweep_conv3d_layernorm_hw_normalize_logsumexp_spatial",
                                  "sweep3_diffusion_resblock_temb_proj", "sweep3_fpn_topdown_interpolate",
                                  "sweep3_kb_add_sub_alpha_rounding_mode", "sweep3_where_zeros_like_special_erf",
                                  "sweep3_causal_pad_conv", "sweep3_threshold_forms", "pointwise_math_by_every_name",
                                  "swin_patch_embed_channels_last", "kb_conv2d_custom_pointwise_forms",
                                  "kb_conv2d_hardswish_by_hand_expression_pools",
                                  "vae_block_conv_in_returned", "conv2d_shared_output",
                                  "conv2d_instnorm_log_nan_to_num_softmax_dtype_var_std", "conv_pools_dilation_divisor",
                                  "inplace_write_on_an_alias", "centring_beside_the_returned_output",
                                  *EARLY_READERS, *SWEEP4])
# Not fast_style_reflection_pads: on an H200 its kernels were 1.7e-4 from float64 where the whole model's eager was
# 9.4e-8 in either layout; verification takes eager's error chain by chain (a chain's channels-last convolution
# there may be TF32's), which this bound on the whole model does not reproduce.
def test_the_fused_chains_run_their_kernels_on_a_gpu(stem: str, tmp_path: Path) -> None:
    """Loose tensors (a functional convolution's, a buffer, views of a 0-dim or (1, C, 1, 1) parameter or of a (C,)
    one viewed in the forward, (1, 1, 1) and (1, 1) ones after a channel reduction, PReLU's weights), modules bound
    whole, mean centrings, in-place forms, a glu or a slice in PyTorch between regions, kernels built on first use:
    the optimized model's outputs, with every chain on its kernels, each as close to float64 as eager's."""
    model, inputs = _model(stem)
    model = model.cuda().eval()
    inputs = tuple(x.cuda() for x in inputs)
    opt = optimized_on_gpu(model, inputs, tmp_path)
    chains = list(fused_chains(opt))
    assert chains and all(c.kernel_model is not None for c in chains)
    with torch.no_grad():
        exact = _outputs(copy.deepcopy(model).double()(*(x.double() for x in inputs)))
        want, got = _outputs(model(*inputs)), _outputs(opt(*inputs))
        # Eager's error in the other layout too: verification takes the larger (fusetune.evaluate: cuDNN's
        # channels-last convolution may be TF32's where the contiguous one is not, and a winner in that layout
        # may carry it)
        last = _outputs(model(*(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
                                for x in inputs)))
    assert all(c.kernel_calls == 1 for c in chains)
    for e, w, lw, g in zip(exact, want, last, got, strict=True):
        if not g.is_floating_point():  # a pool's indices, a count: eager's exactly
            assert g.dtype == w.dtype and torch.equal(g, w)
            continue
        eager, eager_last, ours = (((y.double() - e).norm() / e.norm()).item() for y in (w, lw, g))
        print(f"\n{stem}: error vs float64: eager {eager:.2e} (channels last {eager_last:.2e}), optimized {ours:.2e}")
        assert g.shape == e.shape and ours <= max(8 * eager, 8 * eager_last, 1e-5)
    other = tuple(torch.randn(x.shape[0] + 1, *x.shape[1:], device="cuda") for x in inputs)
    with torch.no_grad():  # a shape not tuned: eager, exactly the model's
        assert all(torch.equal(g, w) for g, w in zip(_outputs(opt(*other)), _outputs(model(*other)), strict=True))


def _outputs(y) -> tuple[torch.Tensor, ...]:
    """A forward's output as a tuple of tensors (a model may return one or several)."""
    return tuple(y) if isinstance(y, (tuple, list)) else (y,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_torchvision_resnet_eval(arch: str, tmp_path: Path) -> None:
    models = pytest.importorskip("torchvision.models", reason="torchvision is not installed")
    torch.manual_seed(0)
    model = getattr(models, arch)(weights=None).cuda().eval()
    for m in model.modules():  # trained-looking statistics, not the initial zeros and ones
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    cache_dir = os.environ.get("FUSETUNE_TEST_CACHE_DIR") or tmp_path
    start = time.perf_counter()
    opt = optimize(model, x, budget_s=GPU_BUDGET_S, cache_dir=cache_dir)
    seconds = time.perf_counter() - start
    chains = list(fused_chains(opt))
    tuned = [c for c in chains if c.kernel_model is not None]
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        want = model(x)
        got = opt(x)
        eager_ms = _median_ms(lambda: model(x))
        fused_ms = _median_ms(lambda: opt(x))

    def error(y: torch.Tensor) -> float:  # relative L2, as scripts/gpu-check measures it
        return ((y.double() - exact).norm() / exact.norm()).item()
    print(f"\n{arch}: {len(chains)} chains, {len(tuned)} tuned in {seconds:.1f} s; eager {eager_ms:.3f} ms, "
          f"optimized {fused_ms:.3f} ms; error vs float64: eager {error(want):.2e}, optimized {error(got):.2e}")
    # A chain is replaced where its kernels beat its own ops (a search always times those): at most every conv's.
    assert 0 < len(chains) <= sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert tuned, "no chain was tuned within the budget"
    # Eager PyTorch's own error (TF32 convolutions by default) sets the scale, as in verification.
    assert error(got) <= max(8 * error(want), 1e-5)
    assert fused_ms < eager_ms  # the whole model, replayed from its CUDA graph


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_training_and_autograd_stay_eager_and_inference_runs_the_kernels(tmp_path: Path, caplog) -> None:
    """The CPU tests cannot tell the kernels from eager (a CPU tensor is eager anyway): here every path is
    a CUDA float32 input of the tuned shape, so only the mode and autograd decide, and the counter and
    the log say which path ran."""
    model, inputs = _model("conv2d_nested_buffer_shift")
    model = model.cuda().eval()
    x = inputs[0].cuda()
    opt = optimized_on_gpu(model, (x,), tmp_path)
    chains = list(fused_chains(opt))
    assert chains and all(c.kernel_model is not None for c in chains)
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    opt.train()  # its batch norm updates the user's running statistics: the model below reads them too
    with torch.no_grad():
        opt(x)
    assert all(c.kernel_calls == 0 for c in chains)
    assert any("training mode" in r.getMessage() for r in caplog.records)
    opt.eval()
    opt(x).sum().backward()  # eval mode, autograd recording: eager, so that backward works
    assert model.block.w.grad is not None and all(c.kernel_calls == 0 for c in chains)
    assert any("autograd" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        got = opt(x)
        want = model(x)
    assert all(c.kernel_calls == 1 for c in chains)
    assert ((got - want).norm() / want.norm()).item() < 1e-2  # TF32 products allowed, as in eager
    with torch.inference_mode():
        opt(x)
    assert all(c.kernel_calls == 2 for c in chains)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("moved", ["optimized", "user's"])
def test_cuda_on_either_model_moves_both(moved: str, cache_dir: Path) -> None:
    """``.cuda()`` on one model alone (batch norm's statistics are buffers): both run on CUDA after."""
    model, inputs = _model("conv1d_batchnorm_eval")
    opt = _optimize(model, inputs, cache_dir)
    (opt if moved == "optimized" else model).cuda()
    x = torch.randn(3, *inputs[0].shape[1:], device="cuda")  # not the tuned shape: both run eager ops
    with torch.no_grad():
        assert torch.equal(opt(x), model(x))
    ours = [t for name, t in opt.named_buffers() if not name.startswith("_tensor_constant")]  # the trace's own
    assert all(t.is_cuda for t in [*model.parameters(), *model.buffers(), *opt.parameters(), *ours])


def test_the_whole_model_check_gives_back_the_ops_of_chains_that_cost_it_time(cache_dir: Path, caplog) -> None:
    """optimize's check (keep_what_pays) times the optimized model against the user's: where it is slower, a
    chain whose own ops make the whole model faster gets them back, the others keep their kernels; where the
    model is still slower, every chain runs its own ops; where it is faster, nothing changes. Timed here by a
    fake clock that charges each chain's kernels what they cost the model in place."""
    from fusetune.optimizer import keep_what_pays

    model, inputs = _model("two_chains_matmul")
    opt = _optimize(model, inputs, cache_dir)
    first, second = chains = list(fused_chains(opt))

    def timing(effect: dict[str, float], shared: float = 0.0):
        """The model's time: 10 ms at the first call (the user's model), then 10 ms plus what each chain's
        kernels cost the model in place (negative: saved), for the chains that run them, plus ``shared`` where
        any does (a cost no one chain's ops remove)."""
        calls = []

        def time_ms(fn) -> float:
            fn()  # the model really runs (on the CPU: every chain's own ops)
            calls.append(fn)
            paying = [c for c in chains if c.pays]
            return 10.0 if len(calls) == 1 else 10.0 + sum(effect[c.name] for c in paying) + (shared if paying else 0)
        return time_ms, calls

    # the second chain's kernels cost the model 1.5 ms in place, the first's save 1 ms: the second gets its ops back
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    time_ms, calls = timing({first.name: -1.0, second.name: 1.5})
    assert keep_what_pays(model, opt, inputs, chains, time_ms) == [second.name]
    assert first.pays and not second.pays and first.kernel_calls == second.kernel_calls == 0
    assert second._why_eager(inputs[0])[0] == "slower" and first._why_eager(inputs[0])[0] != "slower"
    said = [r.getMessage() for r in caplog.records]
    assert any(second.name in m and "runs its own ops again" in m for m in said)
    assert not any("the whole model ran faster with this chain's own ops" in m for m in said)  # trials say nothing
    # both cost it time: both get their ops back (the model is no slower than the user's)
    for c in chains:
        c.pays = True
    time_ms, calls = timing({first.name: 0.5, second.name: 0.5})
    assert sorted(keep_what_pays(model, opt, inputs, chains, time_ms)) == sorted([first.name, second.name])
    assert not first.pays and not second.pays
    # one costs, one saves: only the one that costs goes
    for c in chains:
        c.pays = True
    time_ms, calls = timing({first.name: 0.6, second.name: -0.1})
    assert keep_what_pays(model, opt, inputs, chains, time_ms) == [first.name] and second.pays
    # a cost no one chain's ops remove: still slower after the greedy pass, so every chain runs its own ops
    for c in chains:
        c.pays = True
    time_ms, calls = timing({first.name: -0.1, second.name: -0.1}, shared=0.5)
    assert sorted(keep_what_pays(model, opt, inputs, chains, time_ms)) == sorted([first.name, second.name])
    assert not first.pays and not second.pays
    # faster as it is: two timings, nothing changes
    for c in chains:
        c.pays = True
    time_ms, calls = timing({first.name: -1.0, second.name: -0.5})
    assert keep_what_pays(model, opt, inputs, chains, time_ms) == [] and first.pays and second.pays
    assert len(calls) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_forward_replayed_from_a_cuda_graph_is_the_plain_forwards(tmp_path: Path) -> None:
    """optimize's CUDA graphs (fusetune/graphs.py): the first call at a signature runs plainly, the second
    captures, later ones replay; each output equals the plain forward's on that call's own input (the input is
    copied in), is the caller's to keep (not overwritten by the next call), follows an in-place change of a
    weight, and each call counts once for every chain."""
    model, inputs = _model("resnet_blocks")
    model = model.cuda().eval()
    x = inputs[0].cuda()
    opt = optimized_on_gpu(model, (x,), tmp_path)
    chains = list(fused_chains(opt))
    assert chains and opt._graphs is not None
    plain = copy.copy(opt)  # the same modules and tensors, without graphs
    plain.__dict__["_graphs"] = None
    outs = []

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # the same kernels; a split sum's atomics may reorder
        return torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        for call in range(4):
            y = torch.randn_like(x)
            got = opt(y)
            assert same(got, plain(y)), f"call {call}"
            outs.append((got, got.clone()))
            if call == 0:
                per_call = [c.kernel_calls // 2 for c in chains]  # opt's call and plain's
        assert opt._graphs.replays == 2 and min(per_call) >= 1
        assert [c.kernel_calls for c in chains] == [8 * n for n in per_call]  # opt's four and plain's four
        assert all(torch.equal(kept, copied) for kept, copied in outs)
        first = next(m for m in opt.modules() if isinstance(m, torch.nn.Conv2d))
        first.weight.mul_(1.5)
        y = torch.randn_like(x)
        assert same(opt(y), plain(y))
    assert opt._graphs.replays == 3


def test_a_graph_is_replayed_only_while_the_module_tree_is_the_captured_one() -> None:
    """What a replay would skip or keep stale makes the call run plainly: a forward hook or pre-hook on any
    module, a module in training mode, a replaced submodule (the call after it; the new tree is then plain)."""
    from fusetune.graphs import _plain_structure

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.Sequential(torch.nn.ReLU())).eval()
    assert not _plain_structure(model) and _plain_structure(model)  # listed at the first call, then the same
    handle = model[1][0].register_forward_hook(lambda *_: None)
    assert not _plain_structure(model)
    handle.remove()
    handle = model[0].register_forward_pre_hook(lambda *_: None)
    assert not _plain_structure(model)
    handle.remove()
    model[1].train()
    assert not _plain_structure(model)
    model.eval()
    assert _plain_structure(model)
    model[1][0] = torch.nn.GELU().eval()
    assert not _plain_structure(model) and _plain_structure(model)


def test_cuda_graphs_are_made_of_cuda_calls_alone_and_never_copied() -> None:
    """A call on CPU tensors (or under autograd) runs plainly and leaves nothing behind; a deep copy or a
    pickle of the replayer holds no graph (a graph belongs to the memory it was captured in)."""
    import pickle

    from fusetune.graphs import GraphedForward

    graphs, model, calls = GraphedForward(), torch.nn.Conv2d(3, 3, 1).eval(), []

    def run(x):
        calls.append(x)
        return model(x)
    with torch.no_grad():
        graphs(model, run, (torch.randn(1, 3, 4, 4),), {})
    graphs(model, run, (torch.randn(1, 3, 4, 4),), {})
    assert len(calls) == 2 and not graphs.graphs and not graphs.seen
    graphs.seen.add("a signature")
    assert not copy.deepcopy(graphs).seen and not pickle.loads(pickle.dumps(graphs)).seen


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_models_chains_are_tuned_in_its_dtype(dtype: str, cache_dir: Path) -> None:
    """A model in float16 or bfloat16 is traced in it, so its chains' configs name it (their kernels, their
    verification and their cache keys are that dtype's), and a chain's kernels take inputs of it alone."""
    model, inputs = _model("resnet_blocks")
    model = model.to(getattr(torch, dtype)).eval()
    inputs = tuple(x.to(getattr(torch, dtype)) for x in inputs)
    opt = _optimize(model, inputs, cache_dir)
    chains = list(fused_chains(opt))
    assert chains and all(c.state.spec.dtype == dtype and c.state.spec.precision is None for c in chains)
    assert all(c.dtype == getattr(torch, dtype) and c.kernel_model is not None for c in chains)
    with torch.no_grad():
        assert torch.equal(opt(*inputs), model(*inputs))  # on the CPU: each chain's own ops, exactly


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_model_runs_its_kernels_on_a_gpu(dtype: str, tmp_path: Path) -> None:
    """resnet's blocks in float16 and bfloat16: each chain searched and verified in the dtype, run on its
    kernels, the model within 8x eager's own error at that dtype against float64; a float32 input takes its own ops."""
    model, inputs = _model("resnet_blocks")
    model = model.cuda().to(getattr(torch, dtype)).eval()
    x = inputs[0].cuda().to(getattr(torch, dtype))
    opt = optimized_on_gpu(model, (x,), tmp_path, cuda_graphs=False)
    chains = list(fused_chains(opt))
    assert chains and all(c.kernel_model is not None and c.state.spec.dtype == dtype for c in chains)
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        want, got = model(x), opt(x)
        assert all(c.kernel_calls == 1 for c in chains)
        assert chains[0]._why_eager(x.float())[0] == "dtype"  # another dtype: the chain's own ops

    def error(y: torch.Tensor) -> float:
        return ((y.double() - exact).norm() / exact.norm()).item()
    print(f"\nresnet_blocks {dtype}: error vs float64: eager {error(want):.2e}, optimized {error(got):.2e}")
    assert got.dtype == want.dtype and error(got) <= 8 * error(want)


def test_a_frozen_batch_norm_binds_without_a_count_of_batches(cache_dir: Path) -> None:
    """A FrozenBatchNorm2d (a detection backbone's: four buffers, no num_batches_tracked) is an eval-mode batch
    norm to the importer; the fused chain binds its buffers (the generated norm keeps a count of its own)."""
    model, inputs = _model("frozen_batchnorm_backbone")
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    (chain,) = fused_chains(opt)
    assert chain.kernel_model is not None
    with torch.no_grad():
        assert torch.equal(opt(*inputs), model(*inputs))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_never_replay_what_the_call_would_not_run() -> None:
    """GraphedForward on a small model, no tuning: a forward hook runs on every call, a replaced submodule is
    used, autocast is not replayed into a call without it, a capture under inference mode does not break a
    no_grad call, and a model on another GPU than the current one replays its own outputs."""
    from fusetune.graphs import GraphedForward

    def model_on(device):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).to(device).eval()

    def calls(model, graphs, xs):
        return [graphs(model, torch.nn.Module.__call__.__get__(model), (x,), {}) for x in xs]

    xs = [torch.randn(2, 3, 16, 16, device="cuda") for _ in range(4)]
    with torch.no_grad():
        model, graphs = model_on("cuda"), GraphedForward()
        assert all(torch.allclose(got, model(x)) for got, x in zip(calls(model, graphs, xs), xs))
        assert graphs.replays == 2  # listed, seen, captured and replayed, replayed
        seen = []
        model[2].register_forward_hook(lambda *_: seen.append(1))
        calls(model, graphs, xs)
        assert len(seen) == 4
        model, graphs = model_on("cuda"), GraphedForward()
        calls(model, graphs, xs)
        model[2] = torch.nn.Conv2d(8, 4, 1).cuda().eval()
        assert all(torch.allclose(got, model(x)) for got, x in zip(calls(model, graphs, xs), xs))
        model, graphs = model_on("cuda"), GraphedForward()
        with torch.autocast("cuda", dtype=torch.float16):
            calls(model, graphs, xs)
        assert calls(model, graphs, xs[:1])[0].dtype == torch.float32
    model, graphs = model_on("cuda"), GraphedForward()
    with torch.inference_mode():
        calls(model, graphs, xs)
    with torch.no_grad():
        assert torch.allclose(calls(model, graphs, xs[:1])[0], model(xs[0]))
        if torch.cuda.device_count() > 1:
            other = torch.device("cuda", 1)
            model, graphs = model_on(other), GraphedForward()
            ys = [x.to(other) for x in xs]
            assert all(torch.allclose(got, model(y)) for got, y in zip(calls(model, graphs, ys), ys))
            assert graphs.replays == 2


def test_optimize_says_in_one_line_how_many_chains_run_kernels_and_why_the_others_do_not(tmp_path: Path,
                                                                                          caplog) -> None:
    """The summary a user reads first: n of m chains on fused kernels, and for the rest the reason by count."""
    model, inputs = _model("two_chains_matmul")
    model.eval()
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    _optimize(model, inputs, tmp_path / "kernels")
    eager_wins = FakeBench(times=lambda c: 0.5 if c["producer.impl"] == "eager" else fake_time(c))
    optimize(model, inputs, cache_dir=tmp_path / "eager", trials=TRIALS, benchmarker=eager_wins.factory,
             machine=MACHINE)
    said = [r.getMessage() for r in caplog.records if "convolution chains run fused kernels" in r.getMessage()]
    assert said == ["fusetune.optimize: Model: 2 of 2 convolution chains run fused kernels",
                    "fusetune.optimize: Model: 0 of 2 convolution chains run fused kernels; 2 beaten by their own ops "
                    "in the search"]


@pytest.mark.parametrize("stem", ["sweep_conv2d_spatial_views_mean", "sweep_conv2d_inplace_param_ops_tuple_out",
                                  "sweep3_diffusion_resblock_temb_proj", "sweep3_fpn_topdown_interpolate",
                                  "sweep3_kb_add_sub_alpha_rounding_mode", "sweep3_where_zeros_like_special_erf",
                                  "sweep3_causal_pad_conv", "sweep3_threshold_forms", "vae_block_conv_in_returned",
                                  "conv2d_shared_output", "sr_upsampler_prelu_leaky", "inplace_write_on_an_alias",
                                  "centring_beside_the_returned_output", *EARLY_READERS, *SWEEP4])
def test_every_imported_chain_is_bound(stem: str, cache_dir: Path) -> None:
    """Each chain the import finds is one optimize replaces (a size computed from two shape reads goes with its
    chain; in-place statements are read through; an input computed after the convolution is there when the fused
    call runs; a convolution whose output an op after the chain reads is returned by the chain too, and that op
    reads it there), and the model's outputs are kept."""
    from fusetune.importer import import_traced, load_model, matching_trace, trace

    loaded = load_model(str(MODELS / f"{stem}.py"))
    loaded.model.eval()
    gm = matching_trace(loaded.model, trace(loaded.model, loaded.inputs), loaded.inputs)  # the trace optimize takes
    found = len(import_traced(loaded, gm, Path(cache_dir) / f"import-{stem}").written)
    model, inputs = _model(stem)
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    assert found and len(list(fused_chains(opt))) == found
    fresh = tuple(torch.randn_like(x) for x in inputs)
    with torch.no_grad():
        ours, theirs = opt(*fresh), model(*fresh)
    for a, b in zip(*((o,) if isinstance(o, torch.Tensor) else o for o in (ours, theirs))):
        assert torch.equal(a, b)


def test_a_forward_argument_left_at_its_default_is_traced_as_it(cache_dir: Path, caplog) -> None:
    """forward(x, y, scale, mask=None) called without mask: traced with mask None (a tensor to torch.fx otherwise,
    and the trace would not run); a call that gives mask runs the model's own forward, said once."""
    model, inputs = _model("sweep_forward_arguments_and_dict_output")
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    assert len(list(fused_chains(opt))) == 3
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    x, y = (torch.randn_like(t) for t in inputs[:2])
    mask = torch.rand(2, 2, 7, 8)
    with torch.no_grad():
        for args, kwargs in [((x, y, 0.25), {}), ((x, y, 0.25), {"mask": mask}), ((x, y, 0.25, mask), {})]:
            ours, theirs = opt(*args, **kwargs), model(*args, **kwargs)
            assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert sum("traced with mask at their defaults" in r.getMessage() for r in caplog.records) == 1


def test_a_size_read_off_a_chain_outside_it_holds_at_the_example(cache_dir: Path, caplog) -> None:
    """FPN's F.interpolate(last, size=lateral.shape[-2:]) reads a size of the lateral's chain: the optimized graph
    gives it the traced size, so other input shapes run the model's own forward, said once."""
    model, inputs = _model("sweep3_fpn_topdown_interpolate")
    model.eval()
    opt = _optimize(model, inputs, cache_dir)
    assert len(list(fused_chains(opt))) == 3  # the two laterals' adds, and P6's pool on P5 (which it returns too)
    assert "size = (4, 4)" in opt.code and ".shape" not in opt.code  # no read of a value the chain no longer has
    caplog.set_level(logging.INFO, logger="fusetune.optimize")
    other = tuple(torch.randn(1, x.shape[1], 2 * x.shape[2], 2 * x.shape[3]) for x in inputs)
    with torch.no_grad():
        for args in (other, other, tuple(torch.randn_like(x) for x in inputs)):
            assert all(torch.equal(a, b) for a, b in zip(opt(*args), model(*args)))
    assert sum("the shape of a value of the chain at inner_1" in r.getMessage() for r in caplog.records) == 1


def test_a_forward_writing_a_buffer_is_optimized_from_the_models_state(cache_dir: Path) -> None:
    """A spectral norm's power iteration writes its buffer u before the convolution whose weight it computes: the
    convolution that writes u at every call keeps its own forward (a fused call would recompute the weight from the
    written u), the one writing it in training mode alone is fused in eval mode; checking the trace leaves u as
    it was; the optimized model computes what the model does, from the same state, and writes u alike."""
    model, inputs = _model("sweep4_spectral_norm_buffer_writes")
    model.eval()
    before = [b.clone() for b in model.buffers()]
    opt = _optimize(model, inputs, cache_dir)
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers(), strict=True))
    assert [c.name for c in fused_chains(opt)] == ["Model_chain0", "Model_chain1"]  # sn2's and conv's
    x = torch.randn_like(inputs[0])
    with torch.no_grad():
        ours = opt(x)
        written = [b.clone() for b in model.buffers()]
        for b, saved in zip(model.buffers(), before):
            b.copy_(saved)
        theirs = model(x)
    assert torch.equal(ours, theirs) and all(torch.equal(a, b) for a, b in zip(written, model.buffers()))
