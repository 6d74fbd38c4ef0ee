"""fusetune: autotuned fused convolution epilogues for NVIDIA GPUs."""
__version__ = "0.1.0"
