"""Convolutions whose weight (or bias) the model computes at every call: weight normalisation, pruning masks,
parametrizations. The importer takes such a convolution as a producer whose weight is a ``Derivation``
(fusetune/derived.py): recomputed from the user's tensors (weight_g and weight_v, weight_orig and weight_mask, a
parametrization's originals) at every call of the fused chain and when ``load_tuned`` binds a model, never a
constant of the import, so that ``load_state_dict`` or an optimizer step reaches the kernels.

Three forms:

* forward pre-hooks whose computation is known (HOOKS): the old ``torch.nn.utils.weight_norm`` (WeightNorm) and
  ``torch.nn.utils.prune`` (a BasePruningMethod that does not override apply_mask). A module with any other hook,
  or a forward hook, stays refused (importer.graph._hooked): a fused chain never calls the module, so it would not run it;
* parametrizations (``torch.nn.utils.parametrizations.weight_norm``, a user's own): the importer's tracer traces
  into a parametrized convolution (``traced_into``), so that its weight is a subgraph of the trace on the
  parametrizations' originals, and the convolution a functional one. Only where every parametrization of it
  computes alike in training and in eval mode (``parametrization_refusal``): spectral_norm's power iteration
  writes its u and v in training mode, which neither a traced graph nor a derivation replays; such a convolution
  stays a module of its own, refused with that reason;
* a functional convolution whose weight argument the forward computes from the model's tensors alone
  (``F.conv2d(x, self.weight * self.mask)``): the importer takes that subgraph as the derivation.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
from torch.nn.utils import parametrizations, parametrize, prune
from torch.nn.utils.weight_norm import WeightNorm

from fusetune.derived import Derivation

#: The tensors of a convolution a derivation may compute, as the generated model names them.
PRODUCER_TENSORS = ("weight", "bias")


def _weight_norm_ops(hook: WeightNorm, target: str) -> list[dict[str, Any]]:
    """WeightNorm.compute_weight: torch._weight_norm(<name>_v, <name>_g, dim)."""
    v, g = f"{target}.{hook.name}_v", f"{target}.{hook.name}_g"
    return [{"name": v, "tensor": v}, {"name": g, "tensor": g},
            {"name": f"{target}.{hook.name}", "function": "torch._weight_norm",
             "args": [{"node": v}, {"node": g}, int(hook.dim)], "kwargs": {}}]


def _pruning_ops(hook: prune.BasePruningMethod, target: str) -> list[dict[str, Any]]:
    """BasePruningMethod.apply_mask: <name>_mask.to(dtype=<name>_orig.dtype) * <name>_orig."""
    name = hook._tensor_name
    orig, mask = f"{target}.{name}_orig", f"{target}.{name}_mask"
    cast = f"{target}.{name}_mask_cast"
    return [{"name": orig, "tensor": orig}, {"name": mask, "tensor": mask},
            {"name": cast, "method": "type_as", "args": [{"node": mask}, {"node": orig}], "kwargs": {}},
            {"name": f"{target}.{name}", "function": "operator.mul", "args": [{"node": cast}, {"node": orig}],
             "kwargs": {}}]


def _tensor_name(hook: Any) -> str | None:
    return getattr(hook, "name", None) if isinstance(hook, WeightNorm) else getattr(hook, "_tensor_name", None)


def _known_pruning(hook: Any) -> bool:
    """A pruning method whose mask applies as torch's does (a subclass may override apply_mask)."""
    return isinstance(hook, prune.BasePruningMethod) and type(hook).apply_mask is prune.BasePruningMethod.apply_mask


#: Forward pre-hooks that compute a tensor of the module from others of its own, by a known rule: (does the hook
#: take this form, the derivation's ops of a module at ``target``). Names of the ops are tensor paths (with dots),
#: never a trace's node names.
HOOKS: tuple[tuple[Callable[[Any], bool], Callable[[Any, str], list[dict[str, Any]]]], ...] = (
    (lambda hook: isinstance(hook, WeightNorm), _weight_norm_ops),
    (_known_pruning, _pruning_ops),
)


def hook_derivations(module: nn.Module, target: str) -> dict[str, Derivation] | None:
    """The producer's tensors (``producer.weight``, ``producer.bias``) that ``module``'s forward pre-hooks compute,
    as derivations from the module's own tensors by attribute path (``target`` the module's); None where a hook
    is none of HOOKS, computes another tensor, or two compute the same one (the importer then refuses the module
    with its hooks named), or where there is a forward hook or a global hook (which no fused chain runs)."""
    from torch.nn.modules import module as torch_module

    if (module._forward_hooks or torch_module._global_forward_pre_hooks or torch_module._global_forward_hooks
            or not module._forward_pre_hooks):
        return None
    out: dict[str, Derivation] = {}
    for hook in module._forward_pre_hooks.values():
        name = _tensor_name(hook)
        ops = next((make for takes, make in HOOKS if takes(hook)), None)
        if ops is None or name not in PRODUCER_TENSORS or f"producer.{name}" in out:
            return None
        shape = tuple(getattr(module, name).shape)
        out[f"producer.{name}"] = Derivation(tuple(ops(hook, target)), shape)
    return out


def parametrized_convolution(module: nn.Module, convolutions: Any) -> bool:
    """Whether ``module`` is one of ``convolutions`` (torch.nn's convolution classes) with parametrizations
    (torch.nn.utils.parametrize makes it an instance of a class Parametrized<Conv> whose one base is the class)."""
    return parametrize.is_parametrized(module) and type(module).__bases__[0] in convolutions


class _Into(torch.fx.Tracer):
    """A tracer that traces into every module (a parametrization's own, which torch.fx would keep whole), reading
    buffers as nodes (spectral_norm's u and v)."""

    proxy_buffer_attributes = True

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return False


def _traced_code(plist: nn.Module, training: bool) -> str:
    """The code of a ParametrizationList's forward traced in ``training`` mode (its modes restored after)."""
    modes = [(m, m.training) for m in plist.modules()]
    try:
        plist.train(training)
        return _Into().trace(plist).python_code("self").src
    finally:
        for m, mode in modes:
            m.training = mode


#: Parametrizations known to compute otherwise in training mode, and what they do there (spectral_norm's does
#: not even trace: it branches on the weight's ndim).
TRAINING_PARAMETRIZATIONS: dict[type, str] = {
    parametrizations._SpectralNorm: "spectral_norm's power iteration updates its u and v in training mode",
}


def parametrization_refusal(module: nn.Module) -> str | None:
    """Why the importer does not trace into a parametrized module, None where it does: each of its
    parametrizations must trace, and alike in training and in eval mode (one that branches on self.training, as
    spectral_norm's power iteration writing u and v: a traced graph computes the mode it was traced in, and a
    derivation replayed at each call writes nothing, so either would compute otherwise than the model)."""
    for name, plist in module.parametrizations.items():
        kinds = ", ".join(type(p).__name__ for p in plist)
        known = [TRAINING_PARAMETRIZATIONS[type(p)] for p in plist if type(p) in TRAINING_PARAMETRIZATIONS]
        if known:
            return (f"{type(module).__name__}'s parametrization of {name} ({kinds}) computes otherwise in training "
                    f"mode ({'; '.join(known)}): a fused chain would compute the eval-mode weight in either mode")
        try:
            code = _traced_code(plist, False)
        except Exception as exc:  # noqa: BLE001 - whatever stops the trace keeps the module whole, named
            return (f"{type(module).__name__}'s parametrization of {name} ({kinds}) cannot be traced "
                    f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})")
        try:
            same = _traced_code(plist, True) == code
        except Exception:  # noqa: BLE001 - traces in eval mode alone: it computes otherwise in training mode
            same = False
        if not same:
            return (f"{type(module).__name__}'s parametrization of {name} ({kinds}) computes otherwise in training "
                    "mode (it reads self.training): a fused chain would compute the eval-mode weight in either mode")
    return None


def hook_tensors(model: nn.Module) -> dict[int, torch.Tensor]:
    """A deep copy's memo for the tensors a forward pre-hook computed into plain attributes (weight_norm's and
    prune's ``module.weight``): each is the last call's result, part of an autograd graph, which ``copy.deepcopy``
    refuses ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol"). The copy
    shares it: the hook computes it again before any forward reads it."""
    return {id(value): value for m in model.modules() for value in vars(m).values()
            if isinstance(value, torch.Tensor) and not value.is_leaf}


def owners_refusal(root: nn.Module, reads: tuple[str, ...]) -> str | None:
    """Why a derivation reading these tensors (attribute paths under ``root``) does not replay its model: one is a
    parametrization's (``conv.parametrizations.weight.original``, ``...weight.0._u``) whose module
    parametrization_refusal refuses. torch.export traces through any parametrization in the mode it traced in,
    spectral_norm's included; None where none is."""
    for path in reads:
        owner, found, _ = path.partition(".parametrizations.")
        module = _module_or_none(root, owner) if found else None
        if module is not None and parametrize.is_parametrized(module):
            refused = parametrization_refusal(module)
            if refused is not None:
                return refused
    return None


def _module_or_none(root: nn.Module, path: str) -> nn.Module | None:
    try:
        module = root.get_submodule(path)
    except AttributeError:
        return None
    return module if isinstance(module, nn.Module) else None
