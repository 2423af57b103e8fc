"""What a loaded llama.cpp target keeps (its model, context, batch, cache record and the
drafters reading it), declared once so that each part of the backend can be a module of its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from localspec.core.errors import BackendClosedError
from localspec.core.protocol import Capabilities, Logits, LogitsMode, ModelInfo

from . import drafters
from .abort import Abort
from .dflash import DFlashDrafter
from .features import HiddenRows
from .greedy import DeviceGreedy
from .head import ContextHead
from .kernels import KernelPlan
from .lanes import LaneHost
from .outputs import LogitsRows
from .recurrent import RecurrentRollback
from .tree import TreePass
from .vision import EmbeddingBatch, Places, Projector


class TargetState:
    """The fields of LlamaCppBackend, and the calls one of its parts makes on another."""

    info: ModelInfo
    capabilities: Capabilities
    _options: dict[str, Any]  # what a derived drafter is loaded with
    _lanes: int
    _lane_host: LaneHost | None  # made by lane_host(), once
    _plan: KernelPlan
    _model: Any
    _devices: Any
    _mtp_layers: int
    _vocab: Any
    _n_vocab: int
    _ctx: Any
    _mem: Any
    _abort: Abort
    _logits: LogitsRows
    _greedy: DeviceGreedy
    _recurrent: RecurrentRollback | None
    _in_flight: int
    _states: HiddenRows | None
    _captures: dict[tuple[int, ...], HiddenRows]
    _recorded: list[HiddenRows]
    _heads: list[ContextHead | DFlashDrafter]
    _batch: Any
    _tok: npt.NDArray[Any]
    _pos: npt.NDArray[Any]
    _out: npt.NDArray[Any]
    _tok1: memoryview
    _pos1: memoryview
    _out1: memoryview
    _no_rows: npt.NDArray[np.float32]
    _trees: TreePass | None
    _deferred: list[int]
    _max_rows: int
    _tokens: list[int]
    _unrecorded: bool
    _closed: bool
    _pieces: dict[int, bytes]
    _images: tuple[Projector, EmbeddingBatch] | None = None  # see_images(): a projector and its batch
    _places: Places | None = None  # an M-RoPE target's positions, which part from record indices (vision.py)
    _ahead: tuple[int, ...] = ()  # an image's rows decoded past the record, for the next pass (_eval_whole)

    def _live(self) -> None:
        # Every call reaches into freed C memory once closed: refuse it instead of crashing.
        if self._closed:
            raise BackendClosedError(f"{self.info.name} was closed", "load the model again")

    # -- defined by LlamaCppBackend (backend.py) -------------------------------------------------

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        raise NotImplementedError

    def rollback(self, n: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _host(self) -> drafters.Host:
        raise NotImplementedError

    def _take_deferred(self, n: int) -> list[int]:
        raise NotImplementedError

    def _splits(self, n: int) -> bool:
        raise NotImplementedError
