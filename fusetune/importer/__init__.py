"""``fusetune import``: find the convolution chains of a PyTorch model and write one config per chain.

The model is traced with torch.fx (``symbolic_trace``), or where that fails with torch.export lifted back
to torch.fx's level (fusetune/exported.py), and its shapes propagated with ``ShapeProp`` on the example
inputs. A chain starts at a convolution (a Conv/ConvTranspose module, or ``F.conv*d`` on
module weights) and goes on through ops of the vocabulary while each consumes the previous one's
output and nothing else reads that intermediate value (ops that read the convolution's own output
become ``by: producer``). Every module, function and method the importer knows is a row of one
table, ``TABLE``: (call kind, target) -> a builder that returns the config entries of the op, or the
reason the chain stops before it. An even pad that only an unpadded convolution reads (nn.ReflectionPad2d, F.pad
with a mode) is that convolution's padding and padding_mode (_fold_pad). A module with forward hooks is no chain's
op (_hooked): a fused chain never calls it, so it would not run them; but a convolution whose weight (or bias) the
model computes by a known rule (weight norm, pruning, a parametrization traced into, F.conv2d on a computed tensor)
is a producer whose weight is recomputed from the model's tensors at every call (fusetune/computed_weights.py).

The package, one module per stage, each importing only from the stages below it:

* ``graph``: what every stage asks of a traced node (shape, dtype, a convolution, a shape read, its name);
* ``loading``: the model file or factory, on the CPU in float32 (LoadedModel);
* ``tracing``: torch.fx, else torch.export; shapes; the check of a trace against the model, torch.export's
  trace where torch.fx's computes other values (TraceError where none computes the model);
* ``producers``: the convolution a chain starts at (ProducerMatch), a pad folded into its padding;
* ``operands``: a binary op's other tensor as a parameter, a derived parameter or an extra input;
* ``matching``: the matcher API builders and fusetune/channel_import.py, gate_import.py, slice_import.py build on
  (Site, Mapped, Stop, bind_op, bind_all, module_input, shape_number);
* ``builders/``: the builders, one module per family (pointwise, binary, reductions, reshapes, pools, norms,
  identities);
* ``table``: TABLE, the vocabulary, and ``lookup``;
* ``idioms``, ``pointwise_regions``: subgraphs matched whole (x * f(x), a mean centring, an activation written out);
* ``chains``: the walk from a convolution (Chain, walk_chain);
* ``configs``: a chain as a config, the longest prefix that validates, its write;
* ``importing``: find the chains, write the configs and the map (import_model).

This module is the package's public surface: the names the rest of fusetune and the tests import from it.
"""
from fusetune.importer.builders.reductions import reduction
from fusetune.importer.configs import chain_derived, chain_inputs, fit_chain, write_config
from fusetune.importer.graph import _CONV_MODULES, _dtype, _is_convolution, _is_shape_read, _shape, fetch, has_node
from fusetune.importer.importing import find_chains, import_model, import_traced
from fusetune.importer.loading import _stem, example_arguments, load_model
from fusetune.importer.matching import Mapped, Site, Stop, bind_all, bind_op, module_input, shape_number
from fusetune.importer.operands import ParamRef, declared_view, per_channel_form
from fusetune.importer.producers import match_producer
from fusetune.importer.table import TABLE, _named_module
from fusetune.importer.tracing import CONCRETE_ARGS, TraceError, matching_trace, trace, trace_differs

__all__ = [
    "bind_all", "bind_op", "chain_derived", "chain_inputs", "CONCRETE_ARGS", "_CONV_MODULES", "declared_view", "_dtype",
    "example_arguments", "fetch", "find_chains", "fit_chain", "has_node", "import_model", "import_traced",
    "_is_convolution", "_is_shape_read", "load_model", "Mapped", "match_producer", "matching_trace", "module_input",
    "_named_module", "ParamRef", "per_channel_form", "reduction", "_shape", "shape_number", "Site", "_stem", "Stop",
    "TABLE", "trace", "trace_differs", "TraceError", "write_config",
]
