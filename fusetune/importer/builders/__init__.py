"""The vocabulary's builders, one module per family of ops. A builder takes a Site and returns Mapped or raises Stop
(fusetune/importer/matching.py); fusetune/importer/table.py maps torch's modules, functions and methods to them.
pointwise: activations, math functions, clamps, threshold, round, prelu, the named powers; binary: arithmetic with a
number, a parameter, the convolution's output or an extra input; reductions: sum, mean, max/min, softmax; reshapes:
flatten, view, squeeze; pools; norms: batch, group, instance and layer norms, modules and functional; identities:
dropouts, casts, clone, stochastic depth. (The subgraphs the walk matches whole before the table, which read the table
themselves, are fusetune/importer/idioms.py and pointwise_regions.py.)
"""
