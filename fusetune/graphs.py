"""The optimized model's forward replayed as a CUDA graph, per input signature.

Why: a fused chain does in Python what cuDNN and one or two kernels then do on the GPU (checks, workspace,
launches), and a model of many small chains (a ResNet's 53) spends more time issuing its forward than the GPU
spends running it: measured on an H200, resnet50 at batch 32 took 6.0 ms of host time per forward against
the GPU's ~5 ms, so the fused kernels' savings never showed. A CUDA graph issues the whole forward at once.
torch.compile's max-autotune does the same (its default mode captures CUDA graphs).

The optimized model is a torch.fx trace: its control flow was fixed when it was traced, so every call at one
signature runs the same ops. What can still differ between calls is either in the key (each input's shape,
strides, dtype and device; inference mode or not; which chains run kernels; the addresses of the parameters
and buffers, so a moved or replaced tensor gets a graph of its own, while an in-place update, as
``load_state_dict`` does, is read by the graph as eager code reads it, but by a chain whose kernels keep
something computed from its tensors (the cudnn_fused world's fold, the spectral world's weights' spectrum, a
repeated parameter), whose sources' versions are in the key too, so that an update gets a graph that computes
it again) or makes the call run plainly:
autograd recording, a module in training mode, a forward hook or pre-hook on any module (or a global one:
a replay would skip them), autocast, keyword or non-tensor arguments, a capture already in progress, and
the call after a submodule was replaced (the model's structure is checked each call; the new structure gets
graphs of its own from the next call on).

A signature's first call runs plainly (kernels built, cuDNN's plans chosen), its second captures (after a
warm-up on a side stream, as torch.cuda.graphs asks, under the inputs' device), and later ones replay: the
inputs are copied into the graph's own, and the outputs are cloned out of its memory, so a caller may keep
them across calls. Calls from several streams or threads take turns (a lock, and each replay waits for the
previous one's copies). A capture that fails (an op that synchronises, say) is said once and the signature
runs plainly from then on; so does one whose graph was dropped to keep at most MAX_GRAPHS (its memory is
freed, and capturing it again each time it comes back would cost more than it saves).
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Hashable, Sequence

import torch
import torch.nn as nn
from torch.nn.modules import module as _module
from torch.utils import _pytree as pytree

log = logging.getLogger("fusetune.optimize")

#: Graphs kept per model (one per input signature); the least recently used goes first (its memory with it).
MAX_GRAPHS = 4


class _Graph:
    """One captured forward: the graph, its static inputs and outputs, what each chain counted in it, and an
    event after the last replay's copies (the next replay, on whatever stream, waits for it)."""

    def __init__(self, graph: Any, inputs: list[torch.Tensor], outputs: Any, counts: list[int]) -> None:
        self.graph, self.inputs, self.outputs, self.counts = graph, inputs, outputs, counts
        self.done: Any = None


class GraphedForward:
    """Per input signature, the model's forward as a CUDA graph (see the module's docstring).

    The model's fused chains (fusetune.optimizer.FusedChain) are read at each call for the key (which run
    kernels), and their ``kernel_calls`` keep counting calls, replays included. It holds no model; a copy of
    it holds no graph (graphs belong to the memory they were captured in). A deep copy of the optimized model
    has none at all (torch.fx copies only what the graph reads) and runs plainly."""

    def __init__(self, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_graphs = max_graphs
        self.graphs: collections.OrderedDict[Hashable, _Graph] = collections.OrderedDict()
        self.seen: set[Hashable] = set()
        self.refused: set[Hashable] = set()  # failed to capture, or dropped: plainly from now on
        self.replays = 0
        self.lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> "GraphedForward":
        return GraphedForward(self.max_graphs)

    def __getstate__(self) -> dict:
        return {"max_graphs": self.max_graphs}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_graphs"])

    def __call__(self, model: nn.Module, run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``run(*args, **kwargs)``, replayed from a graph where this signature has one."""
        key = self.key(model, args, kwargs)
        if key is None or key in self.refused:
            return run(*args, **kwargs)
        with self.lock, torch.cuda.device(args[0].device):
            graph = self.graphs.get(key)
            if graph is None:
                if key not in self.seen:  # the first call: plainly (builds, cuDNN's choices, lazy state)
                    self.seen.add(key)
                    return run(*args, **kwargs)
                graph = self._capture(key, run, args, _chains(model))
                if graph is None:
                    return run(*args, **kwargs)
            self.graphs.move_to_end(key)
            stream = torch.cuda.current_stream()
            if graph.done is not None:
                stream.wait_event(graph.done)  # the previous replay's copies, from another stream perhaps
            for static, arg in zip(graph.inputs, args):
                static.copy_(arg)
            graph.graph.replay()
            outputs = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, graph.outputs)
            graph.done = stream.record_event()
            self.replays += 1
            _count(_chains(model), graph.counts)
            return outputs

    def key(self, model: nn.Module, args: tuple, kwargs: dict) -> Hashable | None:
        """What a graph is captured for, or None where this call must run plainly."""
        if kwargs or not args or torch.is_grad_enabled() or torch.is_autocast_enabled():
            return None
        if not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            return None
        if len({a.device for a in args}) > 1 or torch.cuda.is_current_stream_capturing():
            return None
        if _module._global_forward_hooks or _module._global_forward_pre_hooks or not _plain_structure(model):
            return None
        signature = tuple((tuple(a.shape), a.stride(), a.dtype, a.device) for a in args)
        chains = tuple((c.pays, c.fold_versions()) for c in _chains(model))
        tensors = tuple(t.data_ptr() for t in _tensors(model))
        return signature, torch.is_inference_mode_enabled(), chains, tensors

    def _capture(self, key: Hashable, run: Callable[..., Any], args: tuple, chains: Sequence[Any]) -> _Graph | None:
        counts = _counts(chains)
        inputs = [a.clone() for a in args]
        ran: list[list[int]] = []  # what each chain counted in each run: the last is the captured one's

        def counted() -> Any:
            before = _counts(chains)
            out = run(*inputs)
            ran.append([a - b for a, b in zip(_counts(chains), before)])
            return out

        try:
            graph, outputs = capture(counted)
        except Exception as exc:  # an op that cannot be captured: this signature runs plainly from now on
            self.refused.add(key)
            _restore(chains, counts)
            log.warning("fusetune.optimize: the forward at input shapes %s runs without a CUDA graph (its capture "
                        "failed: %s: %s)", [list(a.shape) for a in args], type(exc).__name__, exc)
            return None
        _restore(chains, counts)
        captured = _Graph(graph, inputs, outputs, ran[-1])
        self.graphs[key] = captured
        while len(self.graphs) > self.max_graphs:
            dropped, _ = self.graphs.popitem(last=False)
            self.refused.add(dropped)
            log.info("fusetune.optimize: more than %d input signatures: the least recently used runs without a "
                     "CUDA graph from now on", self.max_graphs)
        return captured


def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn`` captured in a CUDA graph, after a warm-up run on the capturing side stream (as torch.cuda.graphs
    asks), and what the captured run returned (in the graph's memory, overwritten by each replay). Raises what
    the capture raises (an op that synchronises). GraphedForward and the search's graph timing
    (fusetune.evaluate.median_ms) both capture this way."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        outputs = fn()
    return graph, outputs


def _counts(chains: Sequence[Any]) -> list[int]:
    return [chain.kernel_calls for chain in chains]


def _restore(chains: Sequence[Any], counts: Sequence[int]) -> None:
    """The warm-up's and the capture's runs are not the user's calls: each chain's count as before them."""
    for chain, count in zip(chains, counts):
        object.__setattr__(chain, "kernel_calls", count)


def _count(chains: Sequence[Any], counts: Sequence[int]) -> None:
    """A replay runs each chain's kernels as the captured call did: counted as a call of theirs."""
    for chain, count in zip(chains, counts):
        if count:
            object.__setattr__(chain, "kernel_calls", chain.kernel_calls + count)


def _plain_structure(model: nn.Module) -> bool:
    """Whether every module is in eval mode without forward hooks, and the module tree is the one listed
    (each module's children the same objects). A changed tree is listed anew (walking it takes most of a
    millisecond for a ResNet-50, so it is listed once, and checked child by child each call) and this call
    runs plainly."""
    listed = model.__dict__.get("_graph_tree")
    if listed is not None:
        modules, children = listed
        now: list[int] = []
        for m in modules:
            if m.training or m._forward_hooks or m._forward_pre_hooks:
                return False
            now.extend(map(id, m._modules.values()))
        if now == children:
            return True
    modules = list(model.modules())
    model.__dict__["_graph_tree"] = (modules, [id(c) for m in modules for c in m._modules.values()])
    for name in ("_graph_chains", "_graph_slots"):
        model.__dict__.pop(name, None)
    return False


def _chains(model: nn.Module) -> list[Any]:
    """The model's fused chains, listed with the tree (_plain_structure)."""
    chains = model.__dict__.get("_graph_chains")
    if chains is None:
        from fusetune.optimizer import fused_chains

        chains = model.__dict__["_graph_chains"] = list(fused_chains(model))
    return chains


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer the forward may read (their addresses key a graph), through the dicts of the
    modules _plain_structure listed: ``.to()`` swaps a buffer for a new tensor there, and a parameter's data in
    place."""
    slots = model.__dict__.get("_graph_slots")
    if slots is None:
        slots = model.__dict__["_graph_slots"] = [
            (table, name) for module in model.__dict__["_graph_tree"][0]
            for table in (module._parameters, module._buffers) for name in table]
    return [table[name] for table, name in slots if table.get(name) is not None]
