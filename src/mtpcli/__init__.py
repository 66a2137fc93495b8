"""mtpcli: speculative decoding for local MLX language models."""

__version__ = "0.1.0"
