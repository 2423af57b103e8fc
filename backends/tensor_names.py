"""GGUF tensor names and the Hugging Face names of the same tensors, for the decoder families
the torch and MLX backends read (the table llama.cpp's convert_hf_to_gguf.py applies)."""

from __future__ import annotations

# whole-model tensors, without the .weight suffix: GGUF -> Hugging Face
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# a block's tensors: GGUF's blk.N.<short> -> Hugging Face's model.layers.N.<module>
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 has four norms per block; the one after attention is not the FFN's input norm.
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def inverted(table: dict[str, str]) -> dict[str, str]:
    """Hugging Face name -> GGUF name."""
    return {hf: short for short, hf in table.items()}
