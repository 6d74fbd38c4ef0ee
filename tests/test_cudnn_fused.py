"""The cudnn_fused world (fusetune/worlds/cudnn_fused.py): which chains fold into their convolution, and that the
fold (the weights and bias the generated model computes, then the convolution with the residual add and the relu)
is the chain's own ops in float64, with its norms and parameters off their identity, and follows an in-place
update of any tensor it was computed from. On CPU the generated model runs the folded convolution by PyTorch's
ops one by one; on a GPU by cuDNN's fused ones (the GPU test, and the search's verification of every candidate)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from conftest import chain_files
from fusetune.build import load_generated
from fusetune.codegen import render
from fusetune.config import load_config
from fusetune.plan import make_plan
from fusetune.worlds import offered, refusals
from fusetune.worlds.cudnn_fused import fold_table

ROOT = Path(__file__).resolve().parent.parent
FUSED = chain_files("cudnn_fused")
#: Corpus chains whose convolution is followed by something that does not fold, each with why (the refusal's words).
REFUSED = {
    "conv2d_batchnorm_relu_add_producer": "a batch norm in training mode",
    "conv2d_depthwise_batchnorm_eval_hardswish": "hardswish: only per-channel scales",
    "conv2d_hardswish_relu": "hardswish: only per-channel scales",
    "convt2d_gelu_groupnorm": "plain (not transposed) convolutions",
    "conv1d_batchnorm_relu_maxpool_padded": "a pool or a reduction",
    "conv2d_nobias_batchnorm_eval_add_input_relu": None,  # eval batch norm, residual add, relu: it folds
}


def _off_identity(model: torch.nn.Module) -> None:
    """Every batch norm's statistics and affine, and every parameter, drawn away from their initial values."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
                if module.weight is not None:
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.uniform_(-0.5, 0.5)
        for name, p in model.named_parameters(recurse=False):
            p.uniform_(0.5, 1.5)


@pytest.mark.parametrize("path", list(FUSED.values()), ids=list(FUSED))
def test_the_fold_is_the_chain_in_float64_and_follows_its_tensors(path: Path, tmp_path: Path) -> None:
    spec = load_config(path)
    plan = make_plan(spec)
    assert "cudnn_fused" in offered(plan)
    module = load_generated(render(plan).write(tmp_path / path.stem))
    torch.manual_seed(0)
    reference = module.Model().double()
    _off_identity(reference)
    model = module.ModelNew(variant={"producer": {"impl": "cudnn_fused"}}).double().share_from(reference)
    for shape in spec.shapes:
        x = torch.randn(shape, dtype=torch.float64)
        extra = [torch.randn(s, dtype=torch.float64) for s in spec.input_shapes(shape)]
        for layout in ("contiguous", "channels_last"):
            resolved = model._resolve({"producer": {"impl": "cudnn_fused", "layout": layout}})
            got = model.folded(x, resolved, *extra)
            torch.testing.assert_close(got, reference(x, *extra), rtol=1e-12, atol=1e-12)
    # an in-place update of a tensor the fold came from (as load_state_dict makes): the next call folds again
    x = torch.randn(spec.shapes[0], dtype=torch.float64)
    extra = [torch.randn(s, dtype=torch.float64) for s in spec.input_shapes(spec.shapes[0])]
    before = model.fold_versions()
    sources = model._fold_sources(module.WORLDS["cudnn_fused"]["fold"])
    with torch.no_grad():
        for t in sources:
            t.mul_(1.25)
    assert model.fold_versions() != before
    torch.testing.assert_close(model.folded(x, model._resolved, *extra), reference(x, *extra), rtol=1e-12, atol=1e-12)
    # an update PyTorch's version counters do not see (through .data): the fold stands until refresh
    reference.producer.weight.data.mul_(2)
    assert not torch.allclose(model.folded(x, model._resolved, *extra), reference(x, *extra))
    model.refresh()
    torch.testing.assert_close(model.folded(x, model._resolved, *extra), reference(x, *extra), rtol=1e-12, atol=1e-12)


def test_fold_table_is_what_the_generated_model_reads() -> None:
    """The table the world hands the generated model: the affine ops in order, a norm by its module's attribute
    and eps, the residual input, the relu, and the convolution's geometry."""
    plan = make_plan(load_config(FUSED["conv2d_batchnorm_eval_scale_residual_relu"]))
    table = fold_table(plan)
    assert [op["op"] for op in table["ops"]] == ["batch_norm", "mul", "sub", "div"]
    assert table["ops"][0]["eps"] == 1e-3 and table["ops"][1]["param"] == "gamma" and table["ops"][3]["scalar"] == 1.5
    assert table["residual"] == "identity" and table["relu"] is True
    assert (table["stride"], table["padding"], table["dilation"], table["groups"]) == ([2, 2], [1, 1], [1, 1], 1)


@pytest.mark.parametrize("stem", list(REFUSED), ids=list(REFUSED))
def test_what_does_not_fold_is_refused_with_why(stem: str) -> None:
    plan = make_plan(load_config(ROOT / "tests" / "chains" / f"{stem}.yaml"))
    why = refusals(plan).get("cudnn_fused")
    if REFUSED[stem] is None:
        assert why is None and fold_table(plan) is not None
    else:
        assert REFUSED[stem] in why and fold_table(plan) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", list(FUSED.values()), ids=list(FUSED))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cudnn_runs_the_fold_on_a_gpu(path: Path, dtype: str, tmp_path: Path) -> None:
    """cuDNN's fused convolution (torch.cudnn_convolution_relu / _add_relu) on the fold: as close to float64 as
    eager PyTorch's forward at the dtype, in either layout, and still after an in-place update of its tensors."""
    import dataclasses

    spec = dataclasses.replace(load_config(path), dtype=dtype)
    module = load_generated(render(make_plan(spec)).write(tmp_path / f"{path.stem}_{dtype}"))
    torch.manual_seed(0)
    reference = module.Model().cuda()
    _off_identity(reference)
    reference = reference.to(getattr(torch, dtype))
    model = module.ModelNew(variant={"producer": {"impl": "cudnn_fused"}}).cuda().share_from(reference)
    exact = copy.deepcopy(reference).double()
    for update in (False, True):
        if update:
            with torch.no_grad():
                for t in model._fold_sources(module.WORLDS["cudnn_fused"]["fold"]):
                    t.mul_(1.25)
            exact = copy.deepcopy(reference).double()
        for shape in spec.shapes:
            x = torch.randn(shape, device="cuda", dtype=getattr(torch, dtype))
            extra = [torch.randn(s, device="cuda", dtype=x.dtype) for s in spec.input_shapes(shape)]
            want = exact(x.double(), *(e.double() for e in extra))
            for layout in ("contiguous", "channels_last"):
                fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim(), torch.contiguous_format)
                model.set_variant({"producer": {"impl": "cudnn_fused", "layout": layout}})
                with torch.no_grad():
                    got = model(x, *extra)
                    # eager's error in this layout too, as verification takes it (fusetune.evaluate): cuDNN may
                    # take TF32's products in one layout and not in the other
                    eager = [reference(x, *extra), reference(x.contiguous(memory_format=fmt), *extra)]
                error = ((got.double() - want).norm() / want.norm()).item()
                bound = max(((e.double() - want).norm() / want.norm()).item() for e in eager)
                print(f"\n{path.stem} {dtype} {layout} updated={update}: error {error:.2e} (eager {bound:.2e})")
                assert got.shape == want.shape and error <= max(8 * bound, 1e-6)
