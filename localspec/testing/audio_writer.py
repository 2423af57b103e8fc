"""A tiny audio projector written by the tests themselves, random weights, and short WAV files
to play it: llama.cpp's mtmd "qwen2a" type (Qwen2-Audio's), the simplest audio projector it
reads: a Whisper-style encoder (two 1-D convolutions over a log-mel spectrogram, transformer
blocks, a 2x average pool) and one linear layer out to the target's width.

mtmd pads every clip with 30 s of silence and reads it in 30 s windows (3000 mel frames): a
clip shorter than 30 s takes 3000 / 2 (convolution stride) / 2 (pool) = 750 positions in the
target's context."""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.testing.gguf_writer import Spec, write_gguf, write_out
from localspec.testing.vision_writer import ProjectorSpec, normal_weights, write_projector

FRAMES = 3000  # mel frames in one of mtmd's 30 s windows
SAMPLE_RATE = 16_000  # what mtmd resamples every clip to for Whisper-style encoders


@dataclass(frozen=True)
class AudioSpec:
    """Its encoder's sizes: mel bins in, `width` through `blocks` blocks, out_width (the
    target's n_embd) out."""

    out_width: int = 64
    width: int = 32
    heads: int = 2
    ffn: int = 48
    blocks: int = 1
    mel_bins: int = 16
    seed: int = 17
    scale: float = 4.0  # the projector output's standard deviation: how loudly the audio speaks

    @property
    def positions(self) -> int:
        """The target positions one 30 s window takes."""
        return FRAMES // 2 // 2


def audio_projector_tensors(spec: AudioSpec) -> dict[str, np.ndarray]:
    """Random weights under clip.cpp's names ("a." the audio tower's), numpy shapes (GGUF ne
    reversed); Whisper's attention has no key bias, and its convolution biases are columns."""
    w = normal_weights(spec.seed)
    d, mel = spec.width, spec.mel_bins
    out = {
        "a.conv1d.1.weight": w(d, mel, 3, std=(3 * mel) ** -0.5).astype(np.float16),
        "a.conv1d.1.bias": w(d, 1, std=0.1),
        "a.conv1d.2.weight": w(d, d, 3, std=(3 * d) ** -0.5).astype(np.float16),
        "a.conv1d.2.bias": w(d, 1, std=0.1),
        "a.position_embd.weight": w(FRAMES // 2, d, std=0.5),
        "a.post_ln.weight": w(d, std=0.1, center=1.0),
        "a.post_ln.bias": w(d, std=0.1),
        "mm.a.fc.weight": w(spec.out_width, d, std=spec.scale * d**-0.5),
        "mm.a.fc.bias": w(spec.out_width, std=0.1 * spec.scale),
    }
    for i in range(spec.blocks):
        b = f"a.blk.{i}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[b + part + ".weight"] = w(d, d, std=d**-0.5)
            if part != "attn_k":
                out[b + part + ".bias"] = w(d, std=0.1)
        out |= {
            b + "ln1.weight": w(d, std=0.1, center=1.0),
            b + "ln1.bias": w(d, std=0.1),
            b + "ln2.weight": w(d, std=0.1, center=1.0),
            b + "ln2.bias": w(d, std=0.1),
            b + "ffn_up.weight": w(spec.ffn, d, std=d**-0.5),
            b + "ffn_up.bias": w(spec.ffn, std=0.1),
            b + "ffn_down.weight": w(d, spec.ffn, std=spec.ffn**-0.5),
            b + "ffn_down.bias": w(d, std=0.1),
        }
    return out


def write_audio_projector(spec: AudioSpec, path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.projector_type", "qwen2a")
    writer.add_uint32("clip.audio.embedding_length", spec.width)
    writer.add_uint32("clip.audio.feed_forward_length", spec.ffn)
    writer.add_uint32("clip.audio.block_count", spec.blocks)
    writer.add_uint32("clip.audio.projection_dim", spec.out_width)
    writer.add_uint32("clip.audio.attention.head_count", spec.heads)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.audio.num_mel_bins", spec.mel_bins)
    return write_out(writer, audio_projector_tensors(spec), path)


def write_audio_pair(folder: Path, target: Spec | None = None, projector: AudioSpec | None = None) -> tuple[Path, Path]:
    """(target GGUF, audio projector GGUF) of a tiny pair, widths matched."""
    target = target or Spec(arch="llama")
    projector = projector or AudioSpec(out_width=target.hidden)
    folder.mkdir(parents=True, exist_ok=True)
    return write_gguf(target, folder / "audio-target.gguf"), write_audio_projector(
        projector, folder / "mmproj-audio.gguf"
    )


def write_vision_projector_beside(folder: Path, target: Spec | None = None) -> Path:
    """A vision-only projector for the same target, to send audio to and be refused."""
    target = target or Spec(arch="llama")
    return write_projector(ProjectorSpec(out_width=target.hidden), folder / "mmproj-vision.gguf")


def wav_bytes(seconds: float = 29.0, pitch: float = 440.0, seed: int = 0) -> bytes:
    """A mono 16-bit WAV at 16 kHz: a tone of `pitch` Hz under a little noise (seeded). The
    default fills most of mtmd's 30 s window: a short clip's rows are mostly its silence
    padding, which swamps a tiny random model's answer whatever the clip holds."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = np.random.default_rng(seed).normal(0, 0.05, t.shape)
    samples = (0.5 * np.sin(2 * np.pi * pitch * t) + noise).clip(-1, 1)
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(SAMPLE_RATE)
        file.writeframes((samples * 32767).astype("<i2").tobytes())
    return out.getvalue()
