"""Loading checkpoints into resident tensors (safetensors)."""

from gpud_client.loaders.load import load_safetensors
from gpud_client.loaders.safetensors import STORED, FormatError, read_header

__all__ = ["STORED", "FormatError", "load_safetensors", "read_header"]
