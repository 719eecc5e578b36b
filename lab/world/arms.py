"""Stratified randomization: which subjects' facts are written augmented, which plainly.

A randomized world (``WorldSpec.randomized``) assigns *subjects* to two writing arms. The
assignment is *complete randomization within strata*: subjects are grouped by everything that
sets how often and how long their facts are written (the subject's frequency multiplier, whether
mixed training gives it question-form statements, and how many tokens its name has), and within
each stratum a random half goes to each arm (an odd stratum's extra subject by a fair coin). So
the two arms have the same number of subjects, mentions and tokens by construction, up to one
subject per odd stratum, and the arm is independent of those covariates.

The causal test's randomization p-value redraws the arms with :func:`stratified_halves` itself,
so the null distribution is the design's own assignment mechanism (a Fisher randomization test
of the sharp null that the arm changes no subject's outcome; see :mod:`lab.study.randomized` for
why it is approximate there).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

#: the two arms, in the order the tables report them
ARMS = ("augmented", "plain")


def stratified_halves(strata: Sequence[Hashable], rng: np.random.Generator, n: int | None = None) -> np.ndarray:
    """Draw arm assignments: ``True`` = augmented, half of every stratum (see module docstring).

    ``strata``: one stratum key per unit. Returns ``[units]`` (bool), or ``[n, units]`` for ``n``
    independent draws.
    """
    keys = np.unique(np.asarray([hash_key(s) for s in strata]), return_inverse=True)[1]
    draws = 1 if n is None else n
    out = np.zeros((draws, len(keys)), bool)
    for k in range(keys.max() + 1 if len(keys) else 0):
        members = np.flatnonzero(keys == k)
        half, odd = divmod(len(members), 2)
        order = rng.permuted(np.tile(members, (draws, 1)), axis=1)
        out[np.arange(draws)[:, None], order[:, :half]] = True
        if odd:
            extra = rng.random(draws) < 0.5
            out[np.flatnonzero(extra), order[extra, half]] = True
    return out[0] if n is None else out


def hash_key(stratum: Hashable) -> str:
    """A stratum key as a string, so strata of tuples sort and compare in numpy."""
    return repr(stratum)
