"""fusetune: autotuned fused convolution epilogues for NVIDIA GPUs."""
__version__ = "0.1.0"

#: The Python API (what ``from fusetune import ...`` offers); imported on first use, so that the
#: command line starts without torch. (optimize lives in fusetune.optimizer: a submodule named
#: optimize would replace the function as the package's attribute once imported.)
__all__ = ["optimize", "load_tuned"]


def __getattr__(name: str):
    if name == "optimize":
        from fusetune.optimizer import optimize
        return optimize
    if name == "load_tuned":
        from fusetune.deploy import load_tuned
        return load_tuned
    raise AttributeError(f"module 'fusetune' has no attribute {name!r}")
