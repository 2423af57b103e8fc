"""A tree of guesses in one llama_decode: every branch is a sequence of its own.

Each leaf of the tree gets a sequence id, and each node carries the ids of every leaf below
it, so a node shared by several branches is evaluated once. llama.cpp masks a token's
attention to the cells of its first sequence at positions up to its own, which for a node
are exactly its root path: its ancestors carry every id it carries. Before the pass each
branch's sequence takes a copy of the cached text (seq_cp, which in a unified cache only
tags the cells); after it the kept path's sequence becomes sequence 0 and the rest goes
(seq_keep, as llama.cpp's examples/speculative does with its draft trees), so the cache
holds what a chain over that path would have left.

A recurrent or hybrid model keeps one state per sequence that a tree would have to copy and
replay per branch: such models verify chains only (Capabilities.branches = 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import compute, library

llama = library.llama

# Branches one pass may hold: sequence ids 0..BRANCHES-1 (the cache is unified, so any id
# below llama.cpp's LLAMA_MAX_SEQ is allowed; each costs its tags in the cells only).
BRANCHES = 16


def leaf_sets(parents: Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """Each node's sequence ids (one per leaf below it, in leaf order) and each leaf's node."""
    n = len(parents)
    has_child = [False] * n
    for p in parents:
        if p >= 0:
            has_child[p] = True
    leaves = [i for i in range(n) if not has_child[i]]
    seqs: list[list[int]] = [[] for _ in range(n)]
    for s, leaf in enumerate(leaves):
        node = leaf
        while node >= 0:
            seqs[node].append(s)
            node = parents[node]
    return seqs, leaves


class TreePass:
    """The batch and bookkeeping of tree passes on one context."""

    def __init__(self, ctx: Any, mem: Any, max_tokens: int) -> None:
        self._ctx, self._mem = ctx, mem
        self._batch = llama.llama_batch_init(max_tokens, 0, BRANCHES)
        self._max = max_tokens
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(max_tokens,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(max_tokens,))
        self._nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(max_tokens,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(max_tokens,))
        self.seqs: list[list[int]] = []  # each node's sequence ids
        self._past = 0
        self.shift = 0  # positions minus record indices during the open tree (begin)
        self.nodes: list[int] = []  # the open tree's tokens (its owner records them)
        self.trunk = 0  # nodes before the caller's root: deferred tokens of a kept branch (its owner's)
        self.open = False  # a tree is in the cache: other sequences than 0 hold cells

    def branches(self, parents: Sequence[int]) -> int:
        return len(leaf_sets(parents)[1])

    def begin(self, past: int, parents: Sequence[int], shift: int = 0) -> None:
        """Every branch's sequence takes the cached text before the pass; shift: how far the
        positions stand from record indices (an M-RoPE target's images, vision.py)."""
        self.seqs, leaves = leaf_sets(parents)
        self._past, self.shift = past, shift
        self.open = True
        for s in range(1, len(leaves)):
            llama.llama_memory_seq_rm(self._mem, s, -1, -1)
            llama.llama_memory_seq_cp(self._mem, 0, s, -1, -1)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], nodes: range) -> int:
        """One llama_decode over the nodes in `nodes` (a run of the tree in node order)."""
        n = len(nodes)
        self._tok[:n] = [tokens[i] for i in nodes]
        self._pos[:n] = [positions[i] for i in nodes]
        self._out[:n] = 1
        for row, node in enumerate(nodes):
            seqs = self.seqs[node]
            self._nseq[row] = len(seqs)
            ids = self._batch.seq_id[row]
            for j, s in enumerate(seqs):
                ids[j] = s
        self._batch.n_tokens = n
        return compute.decode(self._ctx, self._batch)

    def keep(self, path: Sequence[int]) -> int:
        """The path's sequence becomes sequence 0, cut after the path; the other branches go.
        Returns where the tree began."""
        s = self.seqs[path[-1]][0]  # a branch through the path's last node
        if s != 0:
            llama.llama_memory_seq_keep(self._mem, s)
            llama.llama_memory_seq_cp(self._mem, s, 0, -1, -1)
        llama.llama_memory_seq_keep(self._mem, 0)
        llama.llama_memory_seq_rm(self._mem, 0, self._past + self.shift + len(path), -1)
        self.open = False
        return self._past

    def abandon(self) -> None:
        """Back to one sequence (a rollback in the middle of a tree): branch 0's cells stay,
        for the caller's seq_rm to cut."""
        llama.llama_memory_seq_keep(self._mem, 0)
        self.open = False

    def free(self) -> None:
        llama.llama_batch_free(self._batch)
