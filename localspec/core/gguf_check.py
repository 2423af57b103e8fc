"""The GGUF checks' old import path; they live in localspec.core.gguf_header, the one GGUF module."""

from localspec.core.gguf_header import (
    GGUF_MAGIC,
    check_gguf,
    diagnose_gguf,
    open_model_file,
    quantized_bytes,
    tensor_bytes,
)

__all__ = ["GGUF_MAGIC", "check_gguf", "diagnose_gguf", "open_model_file", "quantized_bytes", "tensor_bytes"]
