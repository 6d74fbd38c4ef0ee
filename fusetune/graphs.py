"""The optimized model's forward replayed as a CUDA graph, per input signature.

Why: a fused chain does in Python what cuDNN and one or two kernels then do on the GPU (checks, workspace,
launches), and a model of many small chains (a ResNet's 53) spends more time issuing its forward than the GPU
spends running it: measured on an H200, resnet50 at batch 32 took 6.0 ms of host time per forward against
the GPU's ~5 ms, so the fused kernels' savings never showed. A CUDA graph issues the whole forward at once.
torch.compile's max-autotune does the same (its default mode captures CUDA graphs).

It is safe here because the optimized model is a torch.fx trace: its control flow was fixed when it was
traced, so every call at one signature runs the same ops. What can still differ between calls is in the key
(each input's shape, strides, dtype and device; which chains run kernels) or makes the call run plainly
(autograd recording, training mode, keyword or non-tensor arguments, a capture already in progress). The
graph reads the parameters and buffers where they were at capture: their addresses are in the key too, so
a moved or replaced tensor gets a graph of its own (an in-place update, as ``load_state_dict`` does, is read
by the graph as it is by eager code).

A signature's first call runs plainly (kernels built, cuDNN's plans chosen), its second captures (after a
warm-up on a side stream, as torch.cuda.graphs asks), and later ones replay: the inputs are copied into the
graph's own, and the outputs are cloned out of its memory, so a caller may keep them across calls. A capture
that fails (an op that synchronises, say) is said once and the signature runs plainly from then on.
"""
from __future__ import annotations

import collections
import logging
from typing import Any, Callable, Hashable, Sequence

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

log = logging.getLogger("fusetune.optimize")

#: Graphs kept per model (one per input signature); the least recently used goes first (its memory with it).
MAX_GRAPHS = 8


class _Graph:
    """One captured forward: the graph, its static inputs and outputs, and what each chain counted in it."""

    def __init__(self, graph: Any, inputs: list[torch.Tensor], outputs: Any, counts: list[int]) -> None:
        self.graph, self.inputs, self.outputs, self.counts = graph, inputs, outputs, counts


class GraphedForward:
    """Per input signature, the model's forward as a CUDA graph (see the module's docstring).

    The model's fused chains (fusetune.optimizer.FusedChain) are read at each call for the key (which run
    kernels), and their ``kernel_calls`` keep counting calls, replays included. Holds no model: a deep copy or
    a pickle of the model gets an empty one (graphs belong to the memory they were captured in)."""

    def __init__(self, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_graphs = max_graphs
        self.graphs: collections.OrderedDict[Hashable, _Graph] = collections.OrderedDict()
        self.seen: set[Hashable] = set()
        self.refused: set[Hashable] = set()
        self.replays = 0

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
        graph = self.graphs.get(key)
        if graph is None:
            if key not in self.seen:  # the first call: plainly (builds, cuDNN's choices, lazy state)
                self.seen.add(key)
                return run(*args, **kwargs)
            graph = self._capture(key, run, args, _chains(model))
            if graph is None:
                return run(*args, **kwargs)
        self.graphs.move_to_end(key)
        for static, arg in zip(graph.inputs, args):
            static.copy_(arg)
        graph.graph.replay()
        self.replays += 1
        _count(_chains(model), graph.counts)
        return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, graph.outputs)

    def key(self, model: nn.Module, args: tuple, kwargs: dict) -> Hashable | None:
        """What a graph is captured for, or None where this call must run plainly."""
        if kwargs or not args or torch.is_grad_enabled() or any(m.training for m in _modules(model)):
            return None
        if not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            return None
        if torch.cuda.is_current_stream_capturing():
            return None
        signature = tuple((tuple(a.shape), a.stride(), a.dtype, a.device) for a in args)
        chains = tuple(c.pays for c in _chains(model))
        tensors = tuple(t.data_ptr() for t in _tensors(model))
        return signature, chains, tensors

    def _capture(self, key: Hashable, run: Callable[..., Any], args: tuple, chains: Sequence[Any]) -> _Graph | None:
        counts = _counts(chains)
        inputs = [a.clone() for a in args]
        try:
            side = torch.cuda.Stream(device=inputs[0].device)
            side.wait_stream(torch.cuda.current_stream(inputs[0].device))
            with torch.cuda.stream(side):
                run(*inputs)  # warm-up on a side stream, as torch.cuda.graphs asks before a capture
            torch.cuda.current_stream(inputs[0].device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            before = _counts(chains)
            with torch.cuda.graph(graph):
                outputs = run(*inputs)
            after = _counts(chains)
        except Exception as exc:  # an op that cannot be captured: this signature runs plainly from now on
            self.refused.add(key)
            _restore(chains, counts)
            log.warning("fusetune.optimize: the forward at input shapes %s runs without a CUDA graph (its capture "
                        "failed: %s: %s)", [list(a.shape) for a in args], type(exc).__name__, exc)
            return None
        _restore(chains, counts)
        captured = _Graph(graph, inputs, outputs, [a - b for a, b in zip(after, before)])
        self.graphs[key] = captured
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return captured


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


def _chains(model: nn.Module) -> list[Any]:
    """The model's fused chains, found once (a walk of a ResNet-50's modules takes most of a millisecond)."""
    chains = model.__dict__.get("_graph_chains")
    if chains is None:
        from fusetune.optimizer import fused_chains

        chains = model.__dict__["_graph_chains"] = list(fused_chains(model))
    return chains


def _modules(model: nn.Module) -> list[nn.Module]:
    """The model's modules, listed once: any in training mode makes a call run plainly (a batch norm that
    updates its statistics, a dropout that draws)."""
    modules = model.__dict__.get("_graph_modules")
    if modules is None:
        modules = model.__dict__["_graph_modules"] = list(model.modules())
    return modules


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer the forward may read (their addresses key a graph), through their modules'
    dicts listed once: ``.to()`` swaps a buffer for a new tensor there, and a parameter's data in place."""
    slots = model.__dict__.get("_graph_slots")
    if slots is None:
        slots = model.__dict__["_graph_slots"] = [
            (table, name) for module in model.modules() for table in (module._parameters, module._buffers)
            for name in table]
    return [table[name] for table, name in slots if table.get(name) is not None]
