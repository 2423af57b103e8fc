"""PyTorch backend: Llama-style and Gemma 3 decoders from GGUF or Hugging Face safetensors,
on the CPU (float32, one thread per physical core) or a CUDA GPU (bfloat16/float16, decode
steps replayed from CUDA graphs).

    backend.py    the Backend protocol: cache bookkeeping, tokenizer, logits to numpy; early_exit()
                  gives a layer-skip self-drafter sharing the weights and KV cache (the verify
                  resumes from its exit), quantized() a QSpec one
    linear.py     weight matrices: float32 column panels (CPU), dense (CUDA), int8 / int4 (packed kernels)
    quantized.py  GGUF blocks into the int4 / int8 kernels' codes; what a model takes in them
    converted.py  those conversions cached per file hash in the user directory
    verify.py     the acceptance rules on torch tensors: a GPU step sends the host two integers
    shapes.py     Llama-3.1-8B / 3.2-1B, Qwen2.5-7B / 0.5B shapes with random weights (benchmarks)
    native.py     AVX2 kernels for short CPU blocks (matmul, RMSNorm, attention), built with cc
    llama.py      Llama, SmolLM2, Mistral, Qwen2/2.5/3 (one module per family, found by name)
    gemma3.py     Gemma 3
    layers.py     static KV cache, RoPE, block attention with its causal mask
    weights.py    GGUF (dequantized with the gguf package) and safetensors, one naming scheme
    ../vocab.py   tokenizer, chat template and special tokens from the model files (shared with MLX)
    cuda.py       CUDA graphs and torch.compile for the decode and verify steps (CUDA only)
"""

from __future__ import annotations

from localspec.core.errors import BackendUnavailableError

try:
    import torch  # noqa: F401 - fail here, with the fix, rather than deep inside a submodule
except ImportError as exc:
    raise BackendUnavailableError(
        "the torch backend needs PyTorch, which is not installed",
        "pip install 'localspec[torch]' (or pick another backend: --backend llamacpp)",
    ) from exc

from .backend import TorchBackend, load

__all__ = ["TorchBackend", "load"]
