"""Does a drafter speak the target's tokenizer? Compares content, not just size: sibling
models often differ only by padding tokens at the end of the vocabulary."""

from __future__ import annotations

from localspec.protocol import VocabIdentity

SIZE_SLACK = 128  # padding rows sibling checkpoints add to their embedding matrices
FIRST_COMPARED = 5  # the first ids are control tokens that siblings legitimately rename


def vocab_mismatch(target: VocabIdentity, draft: VocabIdentity) -> str | None:
    """None when the pair fits, else what differs in a sentence."""
    if target.kind != draft.kind:
        return f"tokenizer types differ: target {target.kind}, drafter {draft.kind}"
    if abs(target.size - draft.size) > SIZE_SLACK:
        return f"vocabulary sizes differ: target {target.size} tokens, drafter {draft.size}"
    if target.bos != draft.bos or target.eos != draft.eos:
        return f"special tokens differ: target BOS/EOS {target.bos}/{target.eos}, drafter {draft.bos}/{draft.eos}"
    for i in range(FIRST_COMPARED, min(target.size, draft.size)):
        if target.token_texts[i] != draft.token_texts[i]:
            return (
                f"token {i} differs: target {target.token_texts[i]!r}, drafter {draft.token_texts[i]!r} "
                "(different tokenizers)"
            )
    return None
