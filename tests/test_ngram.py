"""The prompt-lookup matcher (jspec/ngram.py): which occurrence it copies, and what it proposes.

History rows are right-padded with garbage past `end`, which must never be matched or copied.
"""

import jax.numpy as jnp
import numpy as np

from jspec.decode import ngram

PAD = 9  # garbage past the end of a row


def _propose(rows, K, min_n=1, max_n=ngram.MAX_N):
    """rows: lists of tokens (ragged) -> (drafts [B, K], found [B], n [B], e [B]) as numpy."""
    T = max(len(r) for r in rows) + 3
    history = jnp.asarray([r + [PAD] * (T - len(r)) for r in rows], jnp.int32)
    end = jnp.asarray([len(r) for r in rows], jnp.int32)
    drafts, found = ngram.propose(history, end, K, min_n, max_n)
    n, e = ngram.match(history, end, min_n, max_n)
    return tuple(np.asarray(x) for x in (drafts, found, n, e))


def test_longest_match_first():
    # ... 3 4 | 5 6 was seen after "3 4" at the start, and "4" alone (1-gram) more recently before 7 8
    drafts, found, n, e = _propose([[3, 4, 5, 6, 4, 7, 8, 3, 4]], 2)
    assert found[0] and n[0] == 2 and e[0] == 2
    np.testing.assert_array_equal(drafts[0], [5, 6])


def test_most_recent_occurrence_of_the_longest():
    drafts, _, n, e = _propose([[1, 2, 5, 6, 1, 2, 7, 8, 0, 1, 2]], 2)
    assert n[0] == 2 and e[0] == 6
    np.testing.assert_array_equal(drafts[0], [7, 8])


def test_longest_is_capped_at_max_n():
    row = [1, 2, 3, 4, 5, 6, 0, 3, 4, 5, 6, 0, 2, 3, 4, 5, 6]  # "3 4 5 6" twice: max_n 4 sees both
    drafts, _, n, e = _propose([row], 1)
    assert n[0] == 4 and e[0] == 11  # the later "3 4 5 6", though "2 3 4 5 6" (5 tokens) is older
    assert drafts[0, 0] == 0
    _, _, n, e = _propose([row], 1, max_n=5)
    assert n[0] == 5 and e[0] == 6


def test_no_match_proposes_the_last_token():
    drafts, found, n, _ = _propose([[1, 2, 3, 4], [5]], 3)
    assert not found.any() and (n == 0).all()
    np.testing.assert_array_equal(drafts, [[4, 4, 4], [5, 5, 5]])


def test_min_n_drops_short_matches():
    row = [1, 2, 3, 4, 2]  # "2" was seen; no 2-gram "4 2" was
    _, found, _, _ = _propose([row], 2, min_n=1)
    assert found[0]
    drafts, found, _, _ = _propose([row], 2, min_n=2)
    assert not found[0]
    np.testing.assert_array_equal(drafts[0], [2, 2])


def test_match_at_the_very_end_continues_periodically():
    # The most recent occurrence of "2 3 1 2" ends one period before the end: copying runs past the
    # known tokens, so the period (3 1 2) repeats.
    drafts, found, n, e = _propose([[1, 2, 3, 1, 2, 3, 1, 2], [7, 7, 7]], 5)
    assert found.all() and n[0] == 4 and e[0] == 5
    np.testing.assert_array_equal(drafts[0], [3, 1, 2, 3, 1])
    assert n[1] == 2 and e[1] == 2  # "7 7" seen one token earlier: a run continues
    np.testing.assert_array_equal(drafts[1], [7] * 5)


def test_tokens_past_the_end_are_never_used():
    # Row 0's padding repeats its suffix "5 6" and row 1's holds the pattern: neither may match.
    T = 8
    history = jnp.asarray([[1, 5, 6, 2, 5, 6, 5, 6], [4, 8, 3, 0, 4, 8, 3, 7]], jnp.int32)
    end = jnp.asarray([6, 3], jnp.int32)  # row 0: 1 5 6 2 5 6; row 1: 4 8 3
    drafts, found = ngram.propose(history, end, 3)
    assert history.shape[1] == T
    np.testing.assert_array_equal(np.asarray(found), [True, False])
    np.testing.assert_array_equal(np.asarray(drafts), [[2, 5, 6], [3, 3, 3]])
