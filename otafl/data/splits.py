"""User splits: partition the training set among K users.

The registry :data:`SPLITS` maps each scheme name (``iid``, ``shards``, ``dirichlet``) to
its function; :func:`split_users` looks the name up there and pads the result into a
:class:`UserSplit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from otafl.data.container import _check_int
from otafl.errors import OtaflInputError, check_range, out_of_range


@dataclass(frozen=True, eq=False)
class UserSplit:
    """Partition of the N training samples among K users, padded to a rectangle.

    Attributes
    ----------
    index : [K, max_D], int64
        ``index[k, :counts[k]]`` are the training-set indices held by user k, in
        increasing order. Positions ``>= counts[k]`` are padding and repeat
        ``index[k, 0]``, a valid index of the user's own data, so a stray gather never
        touches another user's samples; they must still be masked (see
        :func:`otafl.data.sample_minibatches`).
    counts : [K], int64
        D_k, the number of samples of user k (every D_k >= 1).
    """

    index: Tensor
    counts: Tensor

    def __post_init__(self) -> None:
        if self.index.dim() != 2 or self.index.dtype != torch.int64:
            raise OtaflInputError(
                f"UserSplit.index must be a [K, max_D] int64 tensor, got shape "
                f"{tuple(self.index.shape)} dtype {self.index.dtype}")
        if self.counts.shape != (self.index.shape[0],) or self.counts.dtype != torch.int64:
            raise OtaflInputError(
                f"UserSplit.counts must be a [{self.index.shape[0]}] int64 tensor, got shape "
                f"{tuple(self.counts.shape)} dtype {self.counts.dtype}")

    @property
    def users(self) -> int:
        """Number of users K."""
        return int(self.counts.shape[0])

    def user_indices(self, k: int) -> Tensor:
        """[D_k], int64: the training-set indices of user k (no padding)."""
        k = _check_int("user", k, 0, self.users - 1)
        return self.index[k, : int(self.counts[k])]


def _split_iid(labels: Tensor, users: int, *, generator: torch.Generator, **_) -> Tensor:
    """Even random split: a random permutation dealt round-robin, so sizes differ by <= 1."""
    n = labels.shape[0]
    owner = torch.empty(n, dtype=torch.int64)
    owner[torch.randperm(n, generator=generator)] = torch.arange(n) % users
    return owner


def _split_shards(labels: Tensor, users: int, *, shards_per_user: int,
                  generator: torch.Generator, **_) -> Tensor:
    """Label shards (McMahan et al. 2017, "Communication-efficient learning", Sec. 3).

    Sort the samples by label (ties in random order), cut the sorted list into
    S = K * shards_per_user contiguous shards of sizes differing by at most one, and deal
    ``shards_per_user`` random shards to each user. A user then sees about
    ``shards_per_user`` labels (one more when a shard straddles a label boundary).
    """
    n = labels.shape[0]
    num_shards = users * shards_per_user
    if num_shards > n:
        raise out_of_range("users * shards_per_user", num_shards, f"[1, {n}] (number of samples)")
    perm = torch.randperm(n, generator=generator)
    by_label = perm[torch.argsort(labels[perm], stable=True)]
    shard_of_position = torch.arange(n) * num_shards // n
    user_of_shard = torch.empty(num_shards, dtype=torch.int64)
    user_of_shard[torch.randperm(num_shards, generator=generator)] = (
        torch.arange(num_shards) // shards_per_user)
    owner = torch.empty(n, dtype=torch.int64)
    owner[by_label] = user_of_shard[shard_of_position]
    return owner


def _split_dirichlet(labels: Tensor, users: int, *, alpha: float,
                     generator: torch.Generator, **_) -> Tensor:
    """Label-skewed split with Dirichlet proportions (Hsu, Qi & Brown 2019, Sec. 3).

    For every class c draw q_c ~ Dirichlet(alpha 1_K) and give user k the share q_{c,k}
    of that class's (shuffled) samples: user k receives the positions in
    ``[floor(n_c Q_{c,k-1}), floor(n_c Q_{c,k}))`` with Q the cumulative sum of q_c.
    Small alpha concentrates each class on few users; alpha -> inf tends to iid.

    Every user gets at least one sample: while some user is empty, one random sample of
    the currently largest user moves to it (at most K moves, each from a user holding
    >= 2 samples, since N >= K). This changes the Dirichlet proportions only where they
    left a user empty.

    torch has no generator-aware Dirichlet sampler, so the proportions come from a numpy
    ``Generator`` whose seed is drawn from ``generator``; the whole split stays a
    function of ``generator``'s state.
    """
    n = labels.shape[0]
    np_rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
    owner = torch.empty(n, dtype=torch.int64)
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).squeeze(1)
        members = members[torch.randperm(members.numel(), generator=generator)]
        share = torch.from_numpy(np_rng.dirichlet(np.full(users, alpha)))
        ends = torch.floor(torch.cumsum(share, 0) * members.numel()).to(torch.int64)
        ends[-1] = members.numel()  # guard against the cumulative sum rounding below 1
        owner[members] = torch.searchsorted(ends, torch.arange(members.numel()), right=True)

    counts = torch.bincount(owner, minlength=users)
    for empty in torch.nonzero(counts == 0).squeeze(1).tolist():
        donor = int(torch.argmax(counts))
        held = torch.nonzero(owner == donor).squeeze(1)
        moved = held[torch.randint(held.numel(), (1,), generator=generator)]
        owner[moved] = empty
        counts[donor] -= 1
        counts[empty] += 1
    return owner


#: Split-scheme registry, the single source of accepted scheme names: name ->
#: function(labels [N], users, *, alpha, shards_per_user, generator) -> owner [N] int64
#: (the user holding each sample).
from otafl.names import SPLITS  # noqa: E402 (the names, torch-free; entries resolve here)


def _pad_by_owner(owner: Tensor, users: int) -> UserSplit:
    """Turn an owner vector [N] into the padded [K, max_D] index of a :class:`UserSplit`."""
    order = torch.argsort(owner, stable=True)  # indices grouped by user, increasing within
    owner_sorted = owner[order]
    counts = torch.bincount(owner, minlength=users)
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(owner.numel()) - starts[owner_sorted]
    first = order[starts]  # every user holds >= 1 sample, so starts[k] is its first index
    index = first.unsqueeze(1).repeat(1, int(counts.max()))
    index[owner_sorted, position] = order
    return UserSplit(index=index, counts=counts)


def split_users(labels: Tensor, users: int, *, scheme: str = "iid", alpha: float = 0.5,
                shards_per_user: int = 2, generator: torch.Generator) -> UserSplit:
    """Partition the training set among K users.

    Parameters
    ----------
    labels : [N], integer
        Training labels (any device; the split is computed on the CPU).
    users : int in [1, N]
        Number of users K.
    scheme : str
        One of ``sorted(SPLITS)``: ``iid`` (even random split, the paper's
        default), ``shards`` (label shards) or ``dirichlet`` (Dirichlet(alpha) label skew).
    alpha : float > 0
        Dirichlet concentration (``dirichlet`` only).
    shards_per_user : int >= 1
        Shards dealt to each user (``shards`` only); needs K * shards_per_user <= N.
    generator : torch.Generator (CPU)
        The only source of randomness.

    Returns
    -------
    UserSplit
        ``index`` [K, max_D] int64 and ``counts`` [K] int64 on the CPU. Every sample
        belongs to exactly one user and every user holds at least one sample.
    """
    if scheme not in SPLITS:
        raise OtaflInputError(
            f"split scheme = {scheme!r} is not one of the allowed names: "
            f"{', '.join(sorted(SPLITS))}")
    integer = not (labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool)
    if labels.dim() != 1 or not integer or labels.numel() == 0:
        raise OtaflInputError(
            f"labels must be a non-empty [N] integer tensor, got shape {tuple(labels.shape)} "
            f"dtype {labels.dtype}")
    labels = labels.detach().to("cpu", torch.int64)
    n = labels.shape[0]
    users = _check_int("users", users, 1, n)
    alpha = check_range("alpha", alpha, 0.0, math.inf, lo_open=True, hi_open=True)
    shards_per_user = _check_int("shards_per_user", shards_per_user, 1, None)
    owner = SPLITS[scheme](labels, users, alpha=alpha, shards_per_user=shards_per_user,
                           generator=generator)
    return _pad_by_owner(owner, users)
