"""Tree verification on a llama.cpp target: one pass over a tree of drafts, every branch a
sequence (tree.py), and the accepted branch kept in the cache as a chain pass leaves it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Logits
from localspec.core.tree import depths

from .library import llama
from .state import TargetState
from .tree import BRANCHES


class VerifiesTrees(TargetState):
    """The TreeBackend side of LlamaCppBackend."""

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> Logits:
        """localspec.core.protocol.TreeBackend: one pass, every branch a sequence (tree.py)."""
        self._live()
        trees, n, past = self._trees, len(tokens), len(self._tokens)
        if trees is None:
            raise InvalidRequestError(f"{self.info.name} verifies chains only", "draft without branches")
        self._check_tree(tokens, parents)
        if self._greedy.attached:  # this pass's logits are wanted
            self._greedy.detach()
        if self._unrecorded:
            self.rollback(past)
        prefix = self._take_deferred(n)  # a kept branch's tokens (keep_branch): the tree's trunk
        if prefix:
            k = len(prefix)
            tokens = [*prefix, *tokens]
            parents = [*range(-1, k - 1), *(p + k if p >= 0 else k - 1 for p in parents)]
            n, past = len(tokens), len(self._tokens)
        trees.trunk = len(prefix)
        depth = depths(parents)
        trees.begin(past, parents, 0 if self._places is None else self._places.at(past) - past)
        self._unrecorded, self._in_flight = True, n
        step = self._max_rows if self._splits(n) else n  # exact kernels: in pieces, as eval_block
        rows = []
        for start in range(0, n, step):
            part = range(start, min(n, start + step))
            if (rc := trees.decode(tokens, [past + trees.shift + d for d in depth], part)) != 0:
                self.rollback(past)
                raise InvalidRequestError(
                    f"llama_decode failed with code {rc} at position {past}", "draft without branches"
                )
            for kept in self._recorded:  # node rows at past + node until keep_branch gathers the path's
                kept.record(past + start, len(part))
            out = np.ctypeslib.as_array(llama.llama_get_logits(self._ctx), shape=(len(part), self._n_vocab))
            rows.append(out if step == n else out.copy())
        self._tokens += tokens[: trees.trunk + 1]  # the root and its trunk; keep_branch records the rest
        trees.nodes = [int(t) for t in tokens]
        out = rows[0] if len(rows) == 1 else np.concatenate(rows)
        return out[trees.trunk :]

    def _check_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> None:
        n = len(tokens)
        if not 0 < n <= self.capabilities.max_block or len(self._tokens) + n > self.info.n_ctx:
            raise InvalidRequestError(
                f"a tree of {n} tokens does not fit the batch or the context", "verify fewer nodes, or a chain"
            )
        if len(parents) != n or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise InvalidRequestError("a tree needs one root (parent -1) first and every parent before its child")
        if any(not 0 <= t < self._n_vocab for t in tokens):
            raise InvalidRequestError(f"a tree token is outside {self.info.name}'s vocabulary of {self._n_vocab}")
        assert self._trees is not None
        if self._trees.branches(parents) > BRANCHES:
            raise InvalidRequestError(f"a tree of more than {BRANCHES} branches", "verify fewer branches")

    def keep_branch(self, path: Sequence[int]) -> None:
        assert self._trees is not None and self._trees.open, "keep_branch follows eval_tree"
        trees = self._trees
        path = [*range(trees.trunk), *(node + trees.trunk for node in path)]
        past = trees.keep(path)
        kept = [trees.nodes[i] for i in path]
        # A path off sequence 0 sits in cells after the other branches' holes, where the next
        # tokens would land before it; flash attention sums cells in their order, so that cache
        # rounds unlike a clean pass's. Its part off sequence 0 is evaluated again, in order: at
        # the head of the next pass (folds_branch), or at once where kernels split passes.
        off = next((k for k, node in enumerate(path) if trees.seqs[node][0] != 0), len(path))
        self._tokens[past:] = kept[:off]
        # The whole path's rows at its positions, as a chain pass leaves them (each node's row
        # is its root path's): a drafter reads them before the next pass evaluates the rest.
        for rows in self._recorded:
            rows.keep_path(past, path)
        self._unrecorded = off < len(path)
        if off < len(path):
            self.rollback(past + off)
            if self.capabilities.folds_branch:
                self._deferred = kept[off:]  # evaluated at the head of the next pass
                self._tokens += self._deferred
            else:
                self.eval_block(kept[off:], "none")
