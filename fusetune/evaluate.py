"""Verification and timing, run inside a worker process on the GPU.

Verification (why each part): fresh random inputs in the module's dtype (never zeros, which
hide unwritten or mis-indexed outputs); every buffer the kernels write pre-filled with NaN (so
an element nobody wrote shows); a float64 reference (the model's own parameters, widened); and
a tolerance relative to eager PyTorch's own error against that reference at the same dtype and
precision, the larger of its errors on contiguous and on channels-last input (cuDNN uses TF32
for some layouts and shapes and not others, and half precision's error is thousands of times
float32's, so a fixed tolerance would be too tight or too loose). Batch norm's running
statistics are checked the same way. Where the config sets a tolerance, the output must also
be ``torch.allclose`` to eager PyTorch's own at the dtype: a user's fixed acceptance test. A model
that returns several tensors (``outputs: [chain, producer]``) has each checked so, in order.

Timing: warm-up, L2 flushed before every run, CUDA events around the forward alone,
median of many runs.
"""
from __future__ import annotations

import copy
import math
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

#: Raised whenever verification gets stricter: part of the cache key (search.key_fields), so winners
#: verified the weaker way are searched again rather than trusted. 2: norm layers moved off their
#: identity, running statistics compared by their change.
VERIFICATION = 2
#: A candidate's error may be this many times eager PyTorch's, plus the floor.
ERROR_RATIO = 8.0
ERROR_FLOOR = 1e-5
#: Errors that leave the CUDA context unusable: the worker must be replaced.
STICKY = ("illegal memory access", "unspecified launch failure", "illegal instruction", "misaligned address",
          "an illegal", "device-side assert", "hardware stack error", "uncorrectable")

_sessions: dict[tuple[str, tuple[int, ...]], "Session"] = {}


def median_ms(fn: Callable[[], Any], reps: int = 20, warmup: int = 3, flush_bytes: int = 256 << 20,
              timing: str = "launch") -> float:
    """Median time of ``fn`` in milliseconds: CUDA events, L2 flushed before each run.

    The flush reads a buffer larger than the L2 rather than writing one: a write leaves the L2 full
    of dirty lines, and writing them back to memory was charged to whatever ran next: a sizeable part
    of a short epilogue's time. ``timing`` (config.TIMINGS): ``graph`` times replays of ``fn`` captured
    in a CUDA graph after the warm-up (graph_of), so a forward of many small kernels is timed without the
    host's gaps between them; where ``fn`` cannot be captured, it raises: a forward that cannot run in a
    graph cannot be the winner of a search for one."""
    import torch

    flush = torch.ones(flush_bytes // 4, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        if timing == "graph":
            fn = graph_of(fn)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends):
            flush.sum()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def graph_of(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` captured in a CUDA graph (fusetune.graphs.capture, as optimize's model captures its forward): its
    replay."""
    import torch

    from fusetune.graphs import capture

    graph, _ = capture(fn)
    torch.cuda.synchronize()
    return graph.replay


def several(out) -> bool:
    """Whether a forward returned several outputs (a tuple or a list, as ``outputs: [chain, producer]``'s model
    does) rather than one tensor: the one test of that form every check here uses."""
    return isinstance(out, (tuple, list))


def outputs_of(out) -> tuple:
    """A forward's outputs as a tuple: one tensor, or each a model returns (``outputs: [chain, producer]``)."""
    return tuple(out) if several(out) else (out,)


def shape_mismatch(out, want) -> str | None:
    """Why a forward's outputs ``out`` are not shaped as the reference's ``want`` (each output's shape, and one
    tensor against several), None where they are."""
    got_shapes = [tuple(o.shape) for o in outputs_of(out)]
    want_shapes = [tuple(o.shape) for o in outputs_of(want)]
    if got_shapes == want_shapes and several(out) == several(want):
        return None
    got_text, want_text = (shapes[0] if len(shapes) == 1 else shapes for shapes in (got_shapes, want_shapes))
    return f"output shape {got_text}, expected {want_text}"


def _errors(out, ref) -> tuple[float, float]:
    """(relative L2 error, max abs error over max |ref|), both in float64; over several outputs (a tuple), the
    largest of each."""
    import torch

    if several(out):
        each = [_errors(o, r) for o, r in zip(out, outputs_of(ref), strict=True)]
        return max(e[0] for e in each), max(e[1] for e in each)

    diff = (out.double() - ref.double())
    ref_norm = ref.double().norm().item()
    scale = ref.double().abs().max().item() if ref.numel() else 0.0
    rel = diff.norm().item() / max(ref_norm, 1e-30)
    mx = diff.abs().max().item() / max(scale, 1e-30) if diff.numel() else 0.0
    if not torch.isfinite(out).all() and torch.isfinite(ref).all():
        return math.inf, math.inf
    return rel, mx


def _round_tf32(t):
    """float32 rounded to TF32 (10 mantissa bits), to nearest with ties away from zero, as
    cvt.rna.tf32.f32 does: add half a unit of the last kept bit to the magnitude, drop the rest."""
    import torch

    bits = t.detach().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32).view_as(t)


def _stat_buffers(model) -> list:
    import torch

    return [b for name, b in model.named_buffers() if name.endswith(("running_mean", "running_var"))
            and isinstance(b, torch.Tensor)]


def _perturb_norms(model) -> None:
    """Move every norm layer off its initial identity (weight 1, bias 0, running mean 0, variance 1),
    in place: at the identity a kernel that dropped, swapped or misindexed a norm's affine map or its
    running statistics would verify. Per channel: a weight of either sign (a negative one turns a
    max pool's extreme around), a bias, and for batch norm running statistics. Drawn from the torch
    generator the session has seeded, so every candidate meets the same model."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if not type(module).__name__.endswith(("Norm", "Norm1d", "Norm2d", "Norm3d")):
                continue
            weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
            if isinstance(weight, torch.Tensor):
                sign = torch.where(torch.rand_like(weight) < 0.25, -1.0, 1.0)
                weight.copy_(sign * (0.5 + torch.rand_like(weight)))
            if isinstance(bias, torch.Tensor):
                bias.copy_(0.5 * torch.randn_like(bias))
            mean, var = getattr(module, "running_mean", None), getattr(module, "running_var", None)
            if isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor):
                mean.copy_(0.5 * torch.randn_like(mean))
                var.copy_(0.5 + 1.5 * torch.rand_like(var))


def _allclose_refusal(out, eager, tolerance: dict) -> str | None:
    """Why ``out`` fails ``torch.allclose(out, eager, atol, rtol)`` (in float64, NaN never close), None
    where it passes: the config's tolerance, a user's acceptance test against eager PyTorch."""
    import torch

    if several(out):  # each output the model returns, in order
        return next((why for o, e in zip(out, outputs_of(eager), strict=True)
                     if (why := _allclose_refusal(o, e, tolerance)) is not None), None)
    got, want = out.double(), eager.double()
    atol, rtol = tolerance["atol"], tolerance["rtol"]
    if torch.allclose(got, want, atol=atol, rtol=rtol):
        return None
    excess = (got - want).abs() - (atol + rtol * want.abs())
    worst = int(torch.nan_to_num(excess, nan=math.inf).argmax().item())
    far = int((~torch.isclose(got, want, atol=atol, rtol=rtol)).sum().item())
    dtype = str(eager.dtype).replace("torch.", "")
    return (f"not allclose to eager {dtype} (atol {atol:g}, rtol {rtol:g}): {far} of {got.numel()} elements off, "
            f"worst {got.flatten()[worst].item():.6g} against {want.flatten()[worst].item():.6g}")


def draw_extra_inputs(generated: Any, shapes: Sequence[Sequence[int]], generator: Any = None) -> list:
    """Fresh random values (standard normal: both signs, never all zeros) for each extra input of a generated
    module (its INPUTS, the forward arguments after x), of ``shapes`` (the config's ``input_shapes`` at the
    input shape: the job carries them, so the module's sources, part of every cache key, never hold the
    config's list of shapes), at the module's dtype on the GPU."""
    import torch

    dtype = getattr(generated, "DTYPE", torch.float32)
    return [torch.randn(tuple(s), device="cuda", generator=generator, dtype=dtype) for s in shapes]


def _in_format(t, fmt):
    """``t`` in memory format ``fmt`` where that format applies to its rank (channels last: 4 or 5 dims)."""
    import torch

    ranks = {torch.channels_last: 4, torch.channels_last_3d: 5}
    return t.contiguous(memory_format=fmt) if ranks.get(fmt, t.dim()) == t.dim() else t.contiguous()


class Session:
    """One generated module at one input shape: the reference, fresh inputs, the eager error."""

    def __init__(self, module_dir: str, build_dir: str, shape: tuple[int, ...], seed: int,
                 arch: str | None = None, problem: str | None = None,
                 input_shapes: Sequence[Sequence[int]] = ()) -> None:
        import torch

        from fusetune.build import load_generated, load_kernels

        self.torch = torch
        self.problem = problem  # the job's name for the problem (runner: its canonical form's hash), if any
        self.generated = load_generated(Path(module_dir))
        # The module's dtype and the user's tolerance (modules rendered before they existed: float32, none).
        self.dtype = getattr(self.generated, "DTYPE", torch.float32)
        self.tolerance = getattr(self.generated, "TOLERANCE", None)
        load_kernels(self.generated, build_dir, arch)
        torch.manual_seed(seed)
        self.reference = self.generated.Model().cuda()
        _perturb_norms(self.reference)
        self.initial_state = copy.deepcopy(self.reference.state_dict())
        self.shape = shape
        self.input_shapes = [tuple(s) for s in input_shapes]  # the extra inputs' (config inputs:), if any
        self.draw_inputs()

    def rebound(self, module_dir: str, build_dir: str, arch: str | None) -> "Session":
        """This session with another module of the same problem (a batch of fusetune.lazy: the same reference
        model, other kernels): its inputs, float64 reference and eager errors kept, as one module of every
        variant kept them for all its candidates. A search in batches moves between modules trial by trial,
        and each new session ran the reference in float64 again."""
        from fusetune.build import load_generated, load_kernels

        other = copy.copy(self)
        other.generated = load_generated(Path(module_dir))
        load_kernels(other.generated, build_dir, arch)
        return other

    def _fresh_reference(self):
        model = self.generated.Model().cuda()
        model.load_state_dict(self.initial_state)
        return model

    def draw_inputs(self) -> None:
        """New random inputs and their float64 reference (and eager PyTorch's error on them at the dtype)."""
        torch = self.torch
        generator = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
        self.x = torch.rand(self.shape, device="cuda", generator=generator, dtype=self.dtype)
        self.inputs = draw_extra_inputs(self.generated, self.input_shapes, generator)  # forward arguments after x
        with torch.no_grad():
            ref64 = self._fresh_reference().double()
            self.stats_before = [b.double().clone() for b in _stat_buffers(ref64)]
            self.out64 = ref64(self.x.double(), *(t.double() for t in self.inputs))
            self.stats64 = [b.clone() for b in _stat_buffers(ref64)]
            # Eager PyTorch's error in either layout: cuDNN picks TF32 algorithms for some layouts
            # and shapes and not for others, and a user of channels-last tensors gets that error.
            errors, outs = [], []
            for fmt in (torch.contiguous_format, self.generated.MEMORY_FORMAT):
                eager = self._fresh_reference()
                outs.append(eager(self.x.contiguous(memory_format=fmt), *(_in_format(t, fmt) for t in self.inputs)))
                errors.append(self._compare(outs[-1], _stat_buffers(eager)))
            self.eager_errors = (max(e[0] for e in errors), max(e[1] for e in errors))
            self.eager_out = outs[0]  # what a user's allclose compares against (TOLERANCE)
            self.tf32_errors = self._tf32_errors() if self.dtype == torch.float32 else None
        del ref64

    def _tf32_errors(self) -> tuple[float, float]:
        """What eager's error would be with its convolution in TF32: the reference in float32 on input
        and weights rounded to TF32 as the tensor cores round them. Reported beside every verdict, so
        that where cuDNN picked a convolution without TF32 (and TF32 kernels are refused) one can
        still tell a kernel with TF32's error from a wrong one."""
        model = self._fresh_reference()
        weight = getattr(model.producer, "weight", None)  # a later region's producer is its input (nn.Identity)
        if weight is not None:
            weight.copy_(_round_tf32(weight))
        return self._compare(model(_round_tf32(self.x), *self.inputs), _stat_buffers(model))

    def _compare(self, out, stats) -> tuple[float, float]:
        """Errors of the output and of each running statistic's change (batch norm's update is
        momentum x the batch's statistic, a small part of a running value away from zero: compared
        whole, an update gone wrong would hide in it; in eval mode the change must be none)."""
        rel, mx = _errors(out, self.out64)
        for got, want, before in zip(stats, self.stats64, self.stats_before):
            r, m = _errors(got.double() - before, want - before)
            rel, mx = max(rel, r), max(mx, m)
        return rel, mx

    def fused(self, variant: dict, fill_value: float | None):
        model = self.generated.ModelNew(variant=variant).cuda()
        model.load_state_dict(self.initial_state)
        model.fill_value = fill_value
        model.fall_back = False  # a variant a launcher refuses fails as itself, not timed as cuDNN's kernels
        return model

    def verify(self, variant: dict) -> dict[str, Any]:
        torch = self.torch
        model = self.fused(variant, float("nan"))
        with torch.no_grad():
            out = model(self.x, *self.inputs)
        torch.cuda.synchronize()
        mismatch = shape_mismatch(out, self.out64)
        if mismatch is not None:
            return {"status": "wrong_result", "log": mismatch}
        rel, mx = self._compare(out, _stat_buffers(model))
        eager_rel, eager_mx = self.eager_errors
        tol_rel = max(ERROR_RATIO * eager_rel, ERROR_FLOOR)
        tol_mx = max(ERROR_RATIO * eager_mx, ERROR_FLOOR)
        info = {"error_rel": rel, "error_max": mx, "eager_error_rel": eager_rel, "eager_error_max": eager_mx}
        if self.tf32_errors is not None:
            info.update(tf32_error_rel=self.tf32_errors[0], tf32_error_max=self.tf32_errors[1])
        if not (rel <= tol_rel and mx <= tol_mx):
            nan = sum(int(torch.isnan(o).sum().item()) for o in outputs_of(out))
            return {"status": "wrong_result", **info,
                    "log": f"error rel {rel:.3g} (allowed {tol_rel:.3g}), max {mx:.3g} (allowed {tol_mx:.3g}); "
                           f"{nan} NaN outputs"}
        if self.tolerance is not None:
            refusal = _allclose_refusal(out, self.eager_out, self.tolerance)
            info["eager_diff_max"] = max(float((o.double() - e.double()).abs().max().item())
                                         for o, e in zip(outputs_of(out), outputs_of(self.eager_out), strict=True))
            if refusal is not None:
                return {"status": "wrong_result", **info, "log": refusal}
        return {"status": "ok", **info}

    def time(self, variant: dict, reps: int, timing: str = "launch") -> float:
        model = self.fused(variant, None)
        return median_ms(lambda: model(self.x, *self.inputs), reps=reps, timing=timing)

    def time_eager(self, reps: int, timing: str = "launch") -> float:
        model = self._fresh_reference()
        return median_ms(lambda: model(self.x, *self.inputs), reps=reps, timing=timing)


def _session(job: dict[str, Any]) -> Session:
    """The session of the job's module and shape: the current one; else, where the job names the same problem
    at the same shape as the current one's (``problem``: another module of one search's batches), the current
    one rebound to the job's module; else a new one."""
    key = (job["module_dir"], tuple(job["shape"]))
    if key not in _sessions:
        current = next(iter(_sessions.values()), None)
        _sessions.clear()  # one problem at a time: free the previous one's GPU memory
        problem = job.get("problem")
        if current is not None and problem is not None and current.problem == problem \
                and current.shape == tuple(job["shape"]):
            _sessions[key] = current.rebound(job["module_dir"], job["build_dir"], job.get("arch"))
        else:
            del current
            _sessions[key] = Session(job["module_dir"], job["build_dir"], tuple(job["shape"]), job.get("seed", 0),
                                     job.get("arch"), problem, job.get("input_shapes", ()))
    return _sessions[key]


def _failure(exc: BaseException) -> dict[str, Any]:
    """Classify an exception from a launch: sticky context errors need a fresh process."""
    import torch

    text = f"{type(exc).__name__}: {exc}"
    sticky = any(s in text for s in STICKY)
    if not sticky:
        try:
            torch.cuda.synchronize()
        except Exception as sync_exc:  # the context is gone
            text += f"\nthen synchronize: {sync_exc}"
            sticky = True
    return {"status": "crash" if sticky else "launch_error", "log": text[-4000:], "restart": sticky}


def _warm(start: float) -> dict[str, Any]:
    """torch imported and this process's CUDA context made (seconds, each first time): what every job needs."""
    try:
        import torch

        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    except Exception as exc:  # no usable GPU here: the first real job says why, in a fresh process
        return {"status": "launch_error", "log": f"{type(exc).__name__}: {exc}", "restart": True,
                "seconds": time.perf_counter() - start}
    return {"status": "ok", "seconds": time.perf_counter() - start}


def handle(job: dict[str, Any]) -> dict[str, Any]:
    """Worker entry point. Jobs: open, evaluate (verify, then time), verify, confirm (on fresh inputs), eager."""
    start = time.perf_counter()
    kind = job["kind"]
    if kind == "warm":  # worker.Worker.warm: get ready while the first module builds
        return _warm(start)
    try:
        session = _session(job)
    except Exception as exc:
        return {"status": "launch_error", "log": traceback.format_exc()[-4000:], "restart": True,
                "error": str(exc)}
    try:
        if kind == "open":
            result: dict[str, Any] = {"status": "ok"}
        elif kind == "eager":
            result = {"status": "ok", "time_ms": session.time_eager(job.get("reps", 20), job.get("timing", "launch"))}
        elif kind in ("evaluate", "verify", "confirm"):
            if kind == "confirm":
                session.draw_inputs()
            verify_start = time.perf_counter()
            result = session.verify(job["variant"])
            result["verify_s"] = time.perf_counter() - verify_start
            if result["status"] == "ok" and kind == "evaluate":
                time_start = time.perf_counter()
                result["time_ms"] = session.time(job["variant"], job.get("reps", 20), job.get("timing", "launch"))
                result["time_s"] = time.perf_counter() - time_start
        else:
            result = {"status": "crash", "log": f"unknown job kind {kind!r}"}
    except Exception as exc:
        result = _failure(exc)
    result["seconds"] = time.perf_counter() - start
    return result
