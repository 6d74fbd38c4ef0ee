"""The spectral world's weights' spectrum is computed once per version of the weights, not at every forward: the
generated model keeps it (ModelNew._weights_spectrum) and passes spectral_stats the raw weights only where the kept
spectrum is stale, so a forward with unchanged weights launches the products alone. What makes it stale: an in-place
write of the weights (an optimizer step, load_state_dict), a new weights tensor, new storage (.to()), a new output
size (the input's spatial shape), or a launch that failed before filling it.

The weights' address and version are in the model's fold_versions, which a CUDA graph of the forward is keyed by
(fusetune/graphs.py), so that a graph captured while the spectrum was kept is not replayed after an update.

On the CPU, the kernels a recorder (``_launch`` replaced) that keeps what each spectral_stats launch was passed.
tests/test_gpu_weights_spectrum.py runs the kernels on a GPU against float64 across a change of the weights.
"""
from __future__ import annotations

import pytest

from fusetune.build import load_generated
from fusetune.config import load_config
from fusetune.lazy import winner_module
from fusetune.plan import make_plan

from conftest import ROOT

torch = pytest.importorskip("torch")

#: A small full transposed convolution (4 -> 10 channels, k = 3) before a batch norm and a spatial mean: the spectral
#: world's chain, at an even output width (its config's shape) and an odd one (ODD).
CHAIN = ROOT / "tests" / "gpu_chains" / "convt3d_spectral_bn_gap_clamp.yaml"
ODD = (3, 4, 4, 5, 7)


class _Kernels:
    """Stands in for the extension: keeps, per spectral_stats launch, the raw weights it was given (None: none, the
    kept spectrum is read as it is) and the weights' spectrum buffer; ``refuse``: raise KernelTooBig there."""

    def __init__(self, generated):
        self.generated, self.launches, self.refuse = generated, [], False

    def launch(self, kernels, stage, variant, dims, *, weight=None, weight_spectrum=None, **_):
        if self.generated.STAGES[stage] != "spectral_stats":
            return
        if self.refuse:
            raise self.generated.KernelTooBig("stage 'spectral_stats' failed to launch: needs more shared memory",
                                              "spectral_stats")
        self.launches.append((weight if weight is not None and weight.numel() else None, weight_spectrum))


def _model(tmp_path, monkeypatch):
    plan = make_plan(load_config(CHAIN))
    generated = load_generated(winner_module(plan, {"producer": {"impl": "spectral"}}).write(tmp_path / "spectral"))
    kernels = _Kernels(generated)
    monkeypatch.setattr(generated, "_launch", kernels.launch)
    monkeypatch.setattr(generated, "_check_input", lambda x: None)  # CPU tensors: the kernels are the recorder
    monkeypatch.setattr(generated, "load_kernels", lambda: None)
    model = generated.ModelNew(variant={"producer": {"impl": "spectral"}})
    model.fall_back = False  # a refused launch raises (as verification runs a variant) rather than running cuDNN's
    return plan, model, kernels


def _computed(model, kernels, x) -> torch.Tensor:
    """Run a forward that must compute the weights' spectrum: the launch got the weights as they are now, and a
    buffer of CIN x C complex bins of the output's size. Returns the buffer."""
    weights, spectrum = _launched(model, kernels, x)
    assert weights is not None and torch.equal(weights.double(), model.producer.weight.detach().double())
    out = [s + k - 1 for s, k in zip(x.shape[2:], model.producer.kernel_size)]
    assert spectrum.dtype == torch.float32 and spectrum.numel() == (
        2 * x.shape[1] * model.producer.out_channels * out[0] * out[1] * (out[2] // 2 + 1))
    return spectrum


def _kept(model, kernels, x, spectrum: torch.Tensor) -> None:
    """Run a forward that must read the kept spectrum: no weights given, the same buffer."""
    weights, again = _launched(model, kernels, x)
    assert weights is None and again is spectrum


def _launched(model, kernels, x) -> tuple:
    """What the one spectral_stats launch of a forward on ``x`` was passed."""
    before = len(kernels.launches)
    model(x)
    assert len(kernels.launches) == before + 1
    return kernels.launches[-1]


def test_the_weights_spectrum_is_kept_until_the_weights_or_the_size_change(tmp_path, monkeypatch):
    plan, model, kernels = _model(tmp_path, monkeypatch)
    x = torch.rand(tuple(plan.spec.shapes[0]))
    first = _computed(model, kernels, x)
    _kept(model, kernels, x, first)
    _kept(model, kernels, torch.rand(x.shape), first)  # new input values, the same weights and size
    versions = model.fold_versions()  # what a CUDA graph of the forward is keyed by (fusetune/graphs.py)
    assert (model.producer.weight.data_ptr(), model.producer.weight._version) in versions
    with torch.no_grad():
        model.producer.weight.add_(1.0)  # as an optimizer step writes it: in place, its version bumped
    assert model.fold_versions() != versions  # a graph captured on the kept spectrum is not replayed after it
    stepped = _computed(model, kernels, x)
    _kept(model, kernels, x, stepped)
    state = {name: value.clone() for name, value in model.state_dict().items()}
    model.load_state_dict(state)  # copies into the very tensors
    _kept(model, kernels, x, _computed(model, kernels, x))
    model.producer.weight = torch.nn.Parameter(torch.randn_like(model.producer.weight))
    replaced = _computed(model, kernels, x)
    _kept(model, kernels, x, replaced)
    at_x = model.fold_versions()
    odd = torch.rand(ODD)  # a new output size: its own spectrum, which the old size's no longer holds
    _kept(model, kernels, odd, _computed(model, kernels, odd))
    assert model.fold_versions() != at_x  # the buffer a graph at x's shape read is gone: that graph is not replayed
    _computed(model, kernels, x)
    model.to(torch.float64)  # new storage and dtype
    _kept(model, kernels, x.double(), _computed(model, kernels, x.double()))


def test_a_failed_launch_keeps_no_spectrum(tmp_path, monkeypatch):
    """Where the launch that was to fill the buffer fails, the next forward computes the spectrum again."""
    plan, model, kernels = _model(tmp_path, monkeypatch)
    x = torch.rand(tuple(plan.spec.shapes[0]))
    kernels.refuse = True
    with pytest.raises(kernels.generated.KernelTooBig, match="more shared memory"):
        model(x)
    kernels.refuse = False
    _kept(model, kernels, x, _computed(model, kernels, x))


def test_updates_the_version_counters_do_not_see_need_refresh(tmp_path, monkeypatch):
    """An update through ``.data`` (and any in-place write of an inference tensor, which counts no versions) leaves
    the kept spectrum as it was, as it leaves a fold; ModelNew.refresh computes it again at the next call. Weights
    made under torch.inference_mode are kept by their storage alone."""
    plan, model, kernels = _model(tmp_path, monkeypatch)
    x = torch.rand(tuple(plan.spec.shapes[0]))
    first = _computed(model, kernels, x)
    model.producer.weight.data.mul_(2.0)
    _kept(model, kernels, x, first)
    model.refresh()
    _kept(model, kernels, x, _computed(model, kernels, x))
    with torch.inference_mode():
        model.producer.weight = torch.nn.Parameter(torch.randn_like(model.producer.weight), requires_grad=False)
        inferred = _computed(model, kernels, x)
        _kept(model, kernels, x, inferred)
        assert model.fold_versions()  # no version counter to read: keyed by the storage, not raising
