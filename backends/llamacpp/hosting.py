"""The drafters a llama.cpp target hosts (its MTP head, a Gemma 4 assistant, EAGLE-3 heads,
DFlash and DSpark drafters, derived self-drafters): made in drafters.py from what it lends
them, closed before it, and the hidden rows they read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from localspec.core.protocol import Backend
from localspec.drafters import cannot_attach

from . import drafters
from .dflash import DFlashDrafter
from .dspark import DSparkDrafter, block_kind
from .eagle3 import Eagle3Head
from .features import HiddenRows, TargetShape, check_capture, last_hidden_states, layer_inputs
from .head import ContextHead
from .library import llama
from .mtp import MtpHead
from .state import TargetState

H = TypeVar("H", bound=ContextHead | DFlashDrafter)  # a drafter reading this target's context


class HostsDrafters(TargetState):
    """The DrafterHost and SelfDrafting sides of LlamaCppBackend."""

    def _adopt(self, head: H) -> H:
        self._heads.append(head)  # it reads this model and this context: closed before them
        return head

    def make_self_drafter(self, kind: str, option: str | None) -> Backend:
        """SelfDrafting: the model's MTP head, or a qspec or layerskip drafter (drafters.make_self_drafter)."""
        if kind == "mtp":
            return self.mtp_head()
        return drafters.make_self_drafter(self._host(), kind, option)

    def derived_drafters(self, kind: str) -> list[tuple[str, Path]]:
        """SelfDrafting: every candidate drafter of a kind, derived (once) for a side-by-side measurement."""
        return drafters.derived_drafters(self._host(), kind)

    def mtp_head(self) -> MtpHead:
        """The model's own MTP block as a drafter (strategy mtp)."""
        self._live()
        return self._adopt(drafters.mtp_head(self._host()))

    def assistant_head(self, path: str) -> MtpHead:
        """A Gemma 4 assistant GGUF (architecture gemma4-assistant) drafting for this target."""
        self._live()
        head = self._adopt(drafters.assistant_head(self._host(), path))
        # It reads this context's KV cache as it drafts. Its trees keep plain decoding's
        # greedy output, but the tests' assistant never has a runner-up taken when sampling,
        # so the sampled path after a taken branch is unexercised: chains only until it is.
        self.capabilities = replace(self.capabilities, branches=1)
        return head

    def eagle3_head(self, path: str) -> Eagle3Head:
        """An EAGLE-3 head GGUF (architecture eagle3) drafting for this target (strategy eagle3)."""
        self._live()
        return self._adopt(drafters.eagle3_head(self._host(), path))

    def attach_head(self, kind: str, path: str) -> ContextHead:
        """DrafterHost: a Gemma 4 assistant ("assistant") or an EAGLE-3 head ("eagle3") from its GGUF."""
        if kind == "assistant":
            return self.assistant_head(path)
        if kind == "eagle3":
            return self.eagle3_head(path)
        raise cannot_attach(kind, path, self.info.backend)

    def attach_block_drafter(self, path: str) -> DFlashDrafter:
        """DrafterHost: the DFlash drafter in `path`, or the DSpark drafter (a DFlash file with a Markov head)."""
        return self.dspark_drafter(path) if block_kind(path) == "dspark" else self.dflash_drafter(path)

    def dspark_drafter(self, path: str) -> DSparkDrafter:
        """A DSpark drafter GGUF drafting blocks for this target (strategy dspark)."""
        self._live()
        drafter = self._adopt(drafters.block_drafter(self._host(), path, "dspark"))
        assert isinstance(drafter, DSparkDrafter)
        return drafter

    def dflash_drafter(self, path: str) -> DFlashDrafter:
        """A DFlash drafter GGUF drafting blocks for this target (strategy dflash)."""
        self._live()
        return self._adopt(drafters.block_drafter(self._host(), path, "dflash"))

    def _target_states(self) -> HiddenRows:
        if self._states is None:
            self._greedy.detach()  # a head reads this context's passes: their outputs stay whole
            width = int(llama.llama_model_n_embd_out(self._model))
            self._states = last_hidden_states(self._ctx, self.info.n_ctx, width)
            self._recorded.append(self._states)
            self.rollback(0)  # positions decoded before now have no states: decode them again
        return self._states

    def layer_features(self, ids: Sequence[int], width: int, drafter: str, kind: str) -> HiddenRows:
        """The inputs of layers `ids` at every cached position, for a drafter (an EAGLE-3 head,
        a DFlash drafter) made for a target `width` wide; refused with what fits when this
        target cannot give them (features.check_capture)."""
        self._live()
        n_embd = int(llama.llama_model_n_embd(self._model))
        check_capture(
            TargetShape(self.info.name, self.info.architecture, self.info.n_layers, n_embd), drafter, kind, ids, width
        )
        key = tuple(ids)
        if key not in self._captures:
            self._greedy.detach()  # as for an MTP head's states
            self._captures[key] = layer_inputs(self._ctx, self.info.n_ctx, key, n_embd)
            self._recorded.append(self._captures[key])
            self.rollback(0)  # positions decoded before now have no rows: decode them again
        return self._captures[key]
