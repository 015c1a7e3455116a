"""The first layer's per-user input sketches (computed once per run), for ghost norms.

See :class:`InputSketch`; the norms themselves are in :mod:`otafl.fl.grads`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from otafl.data import RowBuffer, gather_rows
from otafl.errors import OtaflInputError
from otafl.fl.grads import layer_method


class InputSketch:
    """Per-user isometric sketches of the raw features, computed once per run.

    The first linear layer sees the raw features x_j [F]; its ghost norm needs only their
    inner products x_j . x_j' between samples of the *same* user, and those do not depend on
    w. For user k with local data X_k [D_k, F] (zero-padded to max_D rows), the QR
    factorisation X_k^T = Q_k R_k (Householder, float64; R_k is [r, max_D] with
    r = min(max_D, F)) gives X_k X_k^T = R_k^T R_k, so each local sample gets the r-vector
    phi_j = column j of R_k and phi_j . phi_j' = x_j . x_j' for any two samples of user k.
    With delta_j the output gradients of the user's minibatch

        ||G_k||_F^2 = sum_{j, j'} (x_j . x_j') (delta_j . delta_j') = ||sum_j delta_j phi_j^T||_F^2,

    the norm of an [F_out, r] matrix instead of the [F_out, F] layer gradient. A constant
    last coordinate 1 is appended to every phi_j, so that the same product also yields the
    bias gradient sum_j delta_j (its last column) and its squared norm: one batched product
    per round, n b F_out (r + 1) multiply-adds (:func:`layer_method`), against n b F_out F
    for materialising the layer gradient: the sketch pays off when r + 1 < F.

    The sketch is exact only within a user: every minibatch row must hold samples of one
    user (:meth:`minibatch` checks it).

    Attributes
    ----------
    features : [N, r + 1], phi_j and the constant 1, for every training sample (NaN for
        samples nobody holds).
    user_of : [N] int64, the user holding each sample (-1: nobody).
    """

    def __init__(self, features: Tensor, user_of: Tensor):
        self.features = features
        self.user_of = user_of

    @property
    def rank(self) -> int:
        """r, the sketch dimension (without the constant coordinate)."""
        return self.features.shape[1] - 1

    @classmethod
    def build(cls, x_train: Tensor, split, *, max_entries: int = 2**25,
              users_per_chunk: int = 16) -> InputSketch | None:
        """From the training features [N, F] and a :class:`otafl.data.UserSplit`.

        Returns None (the first layer then takes :func:`layer_method`'s Gram or materialised
        norms) when the sketch could not be cheaper than materialising (r + 1 >= F), when
        its N (r + 1) entries exceed ``max_entries`` (default 2^25, 128 MiB in float32), or
        when the split is not a partition (a sample held by two users).
        """
        index = split.index.to(x_train.device)
        counts = split.counts.to(x_train.device)
        users, max_d = index.shape
        n_features = x_train.shape[1]
        rank = min(max_d, n_features)
        if rank + 1 >= n_features or x_train.shape[0] * (rank + 1) > max_entries:
            return None
        valid = torch.arange(max_d, device=index.device)[None, :] < counts[:, None]  # [K, max_D]
        held = index[valid]  # row-major: user 0's samples, then user 1's, ...
        if torch.unique(held).numel() != held.numel():
            return None
        user_of = torch.full((x_train.shape[0],), -1, dtype=torch.int64, device=index.device)
        user_of[held] = torch.repeat_interleave(torch.arange(users, device=index.device), counts)
        # samples nobody holds get NaN: a minibatch that draws one poisons its user's norm
        features = x_train.new_full((x_train.shape[0], rank + 1), math.nan)
        features[held] = 0.0
        features[held, rank] = 1.0
        chunk = max(1, min(users_per_chunk, 2**24 // (max_d * n_features)))  # <= 128 MiB of float64
        phis = features[:, :rank]
        for start in range(0, users, chunk):
            rows, ok = index[start : start + chunk], valid[start : start + chunk]
            # index_select (a row copy) rather than advanced indexing, and masks only where needed:
            # at K = 10^4 the indexing around the QR otherwise costs half as much as the QR itself
            xs = x_train.index_select(0, rows.reshape(-1)).view(*rows.shape, n_features).to(torch.float64)
            full = bool(ok.all())
            if not full:
                xs.mul_(ok[:, :, None])  # [chunk, max_D, F], padding rows 0
            r = torch.linalg.qr(xs.transpose(1, 2), mode="r").R  # [chunk, rank, max_D]: X X^T = R^T R
            phi = r.transpose(1, 2)  # [chunk, max_D, rank]: phi_j = column j of R_k
            if full:
                phis.index_copy_(0, rows.reshape(-1), phi.reshape(-1, rank).to(features.dtype))
            else:
                phis[rows[ok]] = phi[ok].to(features.dtype)
        return cls(features, user_of)

    def pays_off(self, layer: nn.Module, batch: int) -> bool:
        """Whether :func:`layer_method` takes the sketch for ``layer`` (the model's first module)
        at minibatch size ``batch``; when not, there is no point in gathering it."""
        return isinstance(layer, nn.Linear) and layer_method(
            batch, layer.in_features, layer.out_features, sketch_rank=self.rank) == "sketch"

    def minibatch(self, idx: Tensor, buffer: RowBuffer | None = None) -> Tensor:
        """The sketched features [n, b, r + 1] of minibatches ``idx`` [n, b] (row k: samples of one
        user, as :func:`otafl.data.sample_minibatches` draws them); gathered into ``buffer``'s
        memory when given (then valid until its next use), else into a new tensor."""
        owner = gather_rows(self.user_of, idx)
        if not torch.equal(owner, owner[:, :1].expand_as(owner)):
            raise OtaflInputError("InputSketch.minibatch: every row of idx must hold samples of one user "
                                  "of the split the sketch was built from")
        return gather_rows(self.features, idx) if buffer is None else buffer.gather(self.features, idx)
