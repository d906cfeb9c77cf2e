"""A batch's shapes: each row's tokens rounded up to a capacity bucket, and the batch padded with dummy rows, so
that one compiled program serves every request in a bucket."""

from __future__ import annotations

from jspec.config import SamplingConfig


def capacity_bucket(n: int, limit: int) -> int:
    """The cache capacity for a row of n tokens (prompt + new + K + 1): n rounded up on a grid of eight
    steps per power of two (multiples of 2^(e-4) in (2^(e-1), 2^e], at least 16), at most `limit`.

    The capacity and the batch size are all the shapes of a compiled program (the prompt array is as
    wide as the cache; prompt lengths and max_new_tokens are arrays), so one program serves every
    request in a bucket. The grid bounds what bucketing costs in cache memory: a bucket exceeds the
    capacity it serves by less than 12.5% (from 128 tokens on; by at most 15 tokens below). A geometric
    grid of ratio 1.125 would bound it alike with odd sizes; these are multiples of 16, and of 256 from
    2048 tokens on (the BF16 window's alignment, kvcache.ALIGN), so the cache's tiles stay whole.
    """
    step = max(16, 1 << max((n - 1).bit_length() - 4, 0))
    return min(-(-n // step) * step, limit)


def pad_rows(ids: list, rows: list[SamplingConfig], max_new: list[int], size: int):
    """Pads a batch to `size` rows with dummy rows (one token, max_new 0: done before the first round, so
    they emit nothing); callers drop the results past the real rows."""
    extra = size - len(ids)
    return ids + [[0]] * extra, rows + rows[:1] * extra, max_new + [0] * extra
