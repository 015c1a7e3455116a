r"""Several local DP-SGD steps per round: DP-FedAvg and DP-SCAFFOLD over the air.

Every participant k starts from the global model w and runs S steps of DP-SGD on its own
D_k records (docs/model.md#local-steps): at step s each record enters the minibatch with
probability q (Poisson), every per-example gradient is clipped to norm C, Gaussian noise
N(0, sigma^2 C^2 I_d) is added to their sum, and the sum is divided by the expected batch
size q D_k (D_k is the user's nominal dataset size, a public constant):

    H_{k,s} = (sum_{j in B_{k,s}} clip_C(grad l_j(y_{k,s-1})) + xi_{k,s}) / (q D_k),
    y_{k,s} = y_{k,s-1} - eta_l (H_{k,s} + c - c_k)          (c = c_k = 0 for FedAvg).

User k transmits u_k = -eta_l sum_s H_{k,s} through the MAC (for FedAvg u_k = y_{k,S} - w;
for SCAFFOLD the displacement without the correction terms, see :class:`LocalSteps`).
Power control needs a norm bound: u_k is sent as (L / B) u_k, clipped to L, with the public
bound B of :func:`update_norm_bound`, which the clip exceeds with probability at most
``UPDATE_BOUND_FAILURE`` per user and round (charged to the ``steps`` accountant's delta),
so every transmission meets the power budget exactly as a clipped FedSGD gradient does.
With ``transmit.update_scaling = "clip"`` the update itself is sent and the aggregator clips it
to L (user-level DP-FedAvg, McMahan et al. 2018): the norm is used fully, but the transmission is
no longer linear in the steps, so the ``steps`` accountant credits nothing of the sum; the
user-level accountants (``exact``, ``tight``, ``paper``, ``digital``) bound the L-clipped
vectors as they bound FedSGD's.
The server rescales the estimate by B / L and steps w <- w + eta_g u_hat.

All participants step at once: their local models are rows of one [n, d] tensor and the
per-example clipped gradient sums come from one forward and one backward pass over the
[n, b] minibatch (:func:`clipped_gradient_sums`; ghost norms for ``nn.Sequential`` MLPs,
``torch.func.vmap(grad)`` otherwise).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, grad_and_value, vmap
from torch.nn import functional as F

from otafl.data import RowBuffer
from otafl.errors import OtaflInputError
from otafl.fl.grads import GRADIENT_METHODS, StackedGradients, supports_ghost
from otafl.fl.strategies import ALGORITHMS, UPDATE_SCALINGS, Strategy

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "UPDATE_BOUND_FAILURE",
    "LocalSteps",
    "build_local_steps",
    "clipped_gradient_sums",
    "local_updates",
    "local_updates_loop",
    "update_norm_bound",
]


Algorithm = Strategy  # an entry of ALGORITHMS (name, target, summary, local, control_variates)

UPDATE_BOUND_FAILURE = 1e-12
"""Probability, per user and round, that the update exceeds the power-control bound B."""

SCAFFOLD_CREDITS_TRANSMIT_NOISE = False
"""Test-only switch: True puts back the unsound credit of the artificial and channel noise to
SCAFFOLD's rounds (warm start included), so that the audit's teeth can be shown
(docs/privacy/steps.md#steps-last-step-credit). Never True in a run."""



# --------------------------------------------------------------------------- per-example clipping


def _ghost_sums(model: nn.Sequential, weights: Tensor, x: Tensor, y: Tensor, mask: Tensor, clip: float
                ) -> tuple[Tensor, Tensor]:
    """One forward/backward over [n, b] samples with per-user weights; the per-example gradient
    of a linear layer is the rank-one delta_j a_j^T, so ||g_j||^2 = sum_l ||delta_lj||^2
    (||a_lj||^2 + 1[bias]) and sum_j c_j g_j = sum_j (c_j delta_j) a_j^T per layer."""
    n, b = y.shape
    h = x
    layers, inputs, outputs = [], [], []
    offset = 0
    with torch.enable_grad():
        for module in model:
            if isinstance(module, nn.Linear):
                fo, fi = module.out_features, module.in_features
                w = weights[:, offset:offset + fo * fi].view(n, fo, fi)
                offset += fo * fi
                bias = None
                if module.bias is not None:
                    bias = weights[:, offset:offset + fo]
                    offset += fo
                inputs.append(h.detach())
                z = torch.bmm(h, w.transpose(1, 2))
                if bias is not None:
                    z = z + bias[:, None, :]
                if not z.requires_grad:  # the first layer: its output is the graph's leaf
                    z.requires_grad_(True)
                outputs.append(z)
                layers.append(module)
                h = z
            else:
                h = module(h)
        ce = F.cross_entropy(h.reshape(n * b, -1), y.reshape(-1), reduction="none").view(n, b)
        deltas = torch.autograd.grad((ce * mask).sum(), outputs)
    sq = torch.zeros(n, b, dtype=weights.dtype, device=weights.device)
    for module, a, delta in zip(layers, inputs, deltas):
        a_sq = a.square().sum(-1) + (1.0 if module.bias is not None else 0.0)
        sq = sq + delta.square().sum(-1) * a_sq
    factor = clip / torch.sqrt(sq).clamp(min=clip)  # min(1, C / ||g_j||), 1 for a zero gradient
    pieces = []
    for module, a, delta in zip(layers, inputs, deltas):
        scaled = delta * factor[..., None]
        pieces.append(torch.bmm(scaled.transpose(1, 2), a).flatten(1))
        if module.bias is not None:
            pieces.append(scaled.sum(1))
    return torch.cat(pieces, dim=1), (ce.detach() * mask).sum(1)


def example_loss(model: nn.Module) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """loss(w [d], x_j [F], y_j []) -> the cross-entropy of one example at the flat parameters w
    (registration order), for ``torch.func`` transforms."""
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    sizes = [p.numel() for _, p in model.named_parameters()]

    def loss(flat: Tensor, xj: Tensor, yj: Tensor) -> Tensor:
        params = {n: t.view(s) for n, t, s in zip(names, torch.split(flat, sizes), shapes)}
        return F.cross_entropy(functional_call(model, params, (xj[None],)), yj[None])

    return loss


def _vmap_sums(model: nn.Module, weights: Tensor, x: Tensor, y: Tensor, mask: Tensor, clip: float
               ) -> tuple[Tensor, Tensor]:
    """``torch.func``: vmap over users of vmap over samples of grad (any model)."""
    per_user = vmap(vmap(grad_and_value(example_loss(model)), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
    g, ce = per_user(weights, x, y)  # [n, b, d], [n, b]
    factor = clip / torch.linalg.vector_norm(g, dim=-1).clamp(min=clip) * mask
    return torch.einsum("nb,nbd->nd", factor, g), (ce.detach() * mask).sum(1)


def clipped_gradient_sums(model: nn.Module, weights: Tensor, x: Tensor, y: Tensor, mask: Tensor, clip: float, *,
                          method: str = "auto") -> tuple[Tensor, Tensor]:
    """Every user's sum of per-example gradients clipped to norm C, at the user's own weights.

    Parameters
    ----------
    model : nn.Module, the architecture (its own parameters are not used).
    weights : [n, d], each user's flattened parameters (registration order).
    x : [n, b, F], y : [n, b] int64, mask : [n, b] (1: in the minibatch, 0: padding).
    clip : C > 0.
    method : ``ghost`` (``nn.Sequential`` of linear layers and element-wise activations),
        ``vmap`` (any model) or ``auto``.

    Returns
    -------
    sums : [n, d], sum_j mask_j min(1, C / ||g_j||) g_j.   losses : [n], sum_j mask_j l_j.
    """
    if method not in GRADIENT_METHODS:
        raise OtaflInputError(f"gradient method {method!r} is not one of: {', '.join(GRADIENT_METHODS)}")
    mask = mask.to(weights.dtype)
    if method == "ghost" or (method == "auto" and supports_ghost(model)):
        return _ghost_sums(model, weights, x, y, mask, clip)
    return _vmap_sums(model, weights, x, y, mask, clip)


# --------------------------------------------------------------------------- local steps


def update_norm_bound(*, local_lr: float, local_steps: int, record_sampling: float, record_clip: float,
                      step_noise: float, min_records: int, dim: int, failure: float = UPDATE_BOUND_FAILURE) -> float:
    r"""Public bound B on ||u_k|| = eta_l ||sum_s H_{k,s}||, exceeded with probability <= ``failure``.

    The clipped sums hold at most D_k records of norm <= C, so ||sum_s G_{k,s}|| / (q D_k) <= S C / q;
    the noise sum_s xi_{k,s} ~ N(0, S sigma^2 C^2 I_d) has norm <= sigma C sqrt(S) (sqrt(d) + t)
    with probability >= 1 - exp(-t^2 / 2) (Gaussian concentration of the 1-Lipschitz norm):

        B = eta_l (S C / q + sigma C sqrt(S) (sqrt(d) + sqrt(2 ln(1/failure))) / (q D_min)).
    """
    t = math.sqrt(2.0 * math.log(1.0 / failure)) if step_noise > 0 else 0.0
    q, S, C = record_sampling, local_steps, record_clip
    return local_lr * (S * C / q + step_noise * C * math.sqrt(S) * (math.sqrt(dim) + t) / (q * min_records))


StepDraw = tuple[Tensor, Tensor]  # (mask [n, max_D] bool, standard normal noise [n, d])
GradientSums = Callable[..., tuple[Tensor, Tensor]]  # clipped_gradient_sums' signature


def local_updates(model: nn.Module, start: Tensor, x_train: Tensor, y_train: Tensor, index: Tensor, counts: Tensor,
                  draws: Iterable[StepDraw], *, local_lr: float, record_sampling: float, record_clip: float,
                  step_noise: float, correction: Tensor | None = None, method: str = "auto",
                  gradient_sums: GradientSums | None = None,
                  buffers: tuple[RowBuffer, RowBuffer] | None = None) -> tuple[Tensor, Tensor]:
    """S local DP-SGD steps of n users at once (module docstring).

    start : [d] global model w, or [n, d].   index : [n, max_D] training-set indices of the
    users' records (padding repeats a valid index), counts : [n] D_k.   draws : S pairs
    (mask [n, max_D] bool, the records in each step's Poisson minibatch; z [n, d] standard
    normal, the step noise before scaling by sigma C).   correction : [n, d] c - c_k
    (SCAFFOLD) or None.   gradient_sums : replaces :func:`clipped_gradient_sums` (same
    signature; e.g. a quadratic loss in tests).   buffers : the (features, labels)
    :class:`~otafl.data.RowBuffer` pair each step's records are gathered into (None: a new
    pair for this call, reused over its steps).

    Returns u [n, d] = -eta_l sum_s H_{k,s} and the mean per-example loss [n] over the steps.
    """
    sums_fn = gradient_sums or clipped_gradient_sums
    x_rows, y_rows = buffers if buffers is not None else (RowBuffer(), RowBuffer())
    n = index.shape[0]
    weights = start.expand(n, -1).clone() if start.dim() == 1 else start.clone()
    total = torch.zeros_like(weights)
    norm = (record_sampling * counts.to(weights.dtype))[:, None]
    valid = torch.arange(index.shape[1], device=index.device)[None, :] < counts[:, None]
    loss_sum = torch.zeros(n, dtype=weights.dtype, device=weights.device)
    seen = torch.zeros_like(loss_sum)
    for mask, z in draws:
        mask = mask & valid
        width = int(mask.sum(1).max())
        if width:
            order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :width]  # chosen records first
            chosen = index.gather(1, order)
            sums, losses = sums_fn(model, weights, x_rows.gather(x_train, chosen), y_rows.gather(y_train, chosen),
                                   mask.gather(1, order), record_clip, method=method)
            loss_sum += losses
            seen += mask.sum(1).to(seen.dtype)
        else:
            sums = torch.zeros_like(weights)
        step = (sums + z.to(weights.dtype) * (step_noise * record_clip)) / norm
        total += step
        weights -= local_lr * (step if correction is None else step + correction)
    return -local_lr * total, loss_sum / seen.clamp(min=1.0)


def local_updates_loop(model: nn.Module, start: Tensor, x_train: Tensor, y_train: Tensor, index: Tensor,
                       counts: Tensor, draws: list[StepDraw], *, local_lr: float, record_sampling: float,
                       record_clip: float, step_noise: float, correction: Tensor | None = None) -> Tensor:
    """Reference for :func:`local_updates`: a Python loop over users, each running its S steps
    with per-example gradients from ``torch.func.vmap(grad)`` over its own minibatch. Same
    draws, same result (up to float rounding); the benchmark's per-user baseline."""
    per_example = vmap(grad(example_loss(model)), in_dims=(None, 0, 0))
    out = []
    for k in range(index.shape[0]):
        w = (start if start.dim() == 1 else start[k]).clone()
        total = torch.zeros_like(w)
        records = index[k, :int(counts[k])]
        for mask, z in draws:
            chosen = records[mask[k, :int(counts[k])]]
            step = z[k].to(w.dtype) * (step_noise * record_clip)
            if chosen.numel():
                g = per_example(w, x_train[chosen], y_train[chosen])
                g = g * (record_clip / torch.linalg.vector_norm(g, dim=1).clamp(min=record_clip))[:, None]
                step = step + g.sum(0)
            step = step / (record_sampling * float(counts[k]))
            total += step
            w -= local_lr * (step if correction is None else step + correction[k])
        out.append(-local_lr * total)
    return torch.stack(out)


class LocalSteps:
    """The local-steps side of a run (``train.algorithm`` = ``fedavg`` | ``scaffold``).

    Holds the global model as a flat vector, SCAFFOLD's control variates (server c [d],
    users c_k [K, d]) and the transmit normalisation L / B. Per round
    (:meth:`gradients`) the participants' transmit vectors (L / B) u_k go to the round's
    aggregator as :class:`~otafl.fl.grads.StackedGradients` (which clips them to L); the
    server applies the estimate (:meth:`apply`).

    SCAFFOLD over the air (option II control variates, Karimireddy et al. 2020): the local
    steps use the correction c - c_k; the new c_k+ = (1/S) sum_s H_{k,s} = -u_k / (eta_l S)
    stays with the user. The user transmits u_k only, i.e. its displacement without the
    correction, y_{k,S} - w + eta_l S (c - c_k): the pair (Delta y_k, Delta c_k) of the
    paper is linearly dependent given the public c (Delta y_k = -eta_l S (Delta c_k + c)),
    so a second channel use would carry nothing new, and both contain c_k, the user's
    previous output, whose re-release in new subset sums sum-domination does not cover
    (docs/privacy/steps.md#steps). The server steps w <- w + eta_g u_hat and
    c <- c + rho (-u_hat / (eta_l S) - c) with rho = |K_t| / K (``known``) or mu_t / K
    (``unknown``): the departing c_k are replaced by their estimate c. With full
    participation this is SCAFFOLD exactly.
    """

    def __init__(self, *, algorithm: str, model: nn.Module, x_train: Tensor, y_train: Tensor, index: Tensor,
                 counts: Tensor, local_steps: int, local_lr: float, server_lr: float, record_sampling: float,
                 record_clip: float, step_noise: float, transmit_clip: float, warm_start: bool,
                 mask_generator: torch.Generator, noise_generator: torch.Generator, method: str = "auto",
                 gradient_sums: GradientSums | None = None, update_scaling: str = "bound"):
        if algorithm not in ALGORITHMS or not ALGORITHMS[algorithm].local:
            raise OtaflInputError(f"train.algorithm = {algorithm!r} has no local steps; "
                                  f"choose one of: {', '.join(n for n, a in ALGORITHMS.items() if a.local)}")
        self.algorithm = ALGORITHMS[algorithm]
        self.model = model
        self.params = list(model.parameters())
        self.x_train, self.y_train = x_train, y_train
        self.index, self.counts = index, counts
        self.S, self.lr, self.server_lr = int(local_steps), float(local_lr), float(server_lr)
        self.q, self.C, self.sigma = float(record_sampling), float(record_clip), float(step_noise)
        self.L = float(transmit_clip)
        self.warm_start = bool(warm_start)
        self.masks, self.noise = mask_generator, noise_generator
        self.method = method
        self.gradient_sums = gradient_sums
        self.rows = (RowBuffer(), RowBuffer())  # each step's records, gathered into the same memory every step
        dim = sum(p.numel() for p in self.params)
        self.dim = dim
        min_records = int(counts.min())
        self.bound = update_norm_bound(local_lr=self.lr, local_steps=self.S, record_sampling=self.q,
                                       record_clip=self.C, step_noise=self.sigma, min_records=min_records, dim=dim)
        self.warm_bound = update_norm_bound(local_lr=1.0, local_steps=1, record_sampling=1.0, record_clip=self.C,
                                            step_noise=self.sigma, min_records=min_records, dim=dim)
        if update_scaling not in UPDATE_SCALINGS:
            raise OtaflInputError(f"transmit.update_scaling = {update_scaling!r} is not one of: "
                                  f"{', '.join(UPDATE_SCALINGS)}")
        # bound: send (L / B) u, linear in the steps (the steps accountant's credits); clip: send u and
        # let the aggregator clip it to L (user-level DP-FedAvg; nothing of the sum is credited)
        self.clips = update_scaling == "clip"
        self.scale = 1.0 if self.clips else self.L / self.bound
        self.warm_scale = 1.0 if self.clips else self.L / self.warm_bound
        users = counts.shape[0]
        self.update_clip_failure = min(1.0, users * UPDATE_BOUND_FAILURE) if self.sigma > 0 and not self.clips else 0.0
        ref = self.params[0]
        self.c = ref.new_zeros(dim) if self.algorithm.control_variates else None
        self.c_users = ref.new_zeros(users, dim) if self.algorithm.control_variates else None

    @property
    def weights(self) -> Tensor:
        """The global model w as a flat [d] vector (a copy)."""
        return torch.nn.utils.parameters_to_vector(self.params).detach()

    def _draws(self, users: Tensor, steps: int, record_sampling: float) -> Iterator[StepDraw]:
        n, width = users.shape[0], self.index.shape[1]
        for _ in range(steps):
            u = torch.rand(n, width, generator=self.masks, dtype=torch.float64, device=self.masks.device)
            z = torch.randn(n, self.dim, generator=self.noise, dtype=self.params[0].dtype, device=self.noise.device)
            yield u.to(users.device) < record_sampling, z.to(users.device)

    def gradients(self, active: Tensor) -> tuple[StackedGradients, float, float]:
        """The active users' transmit vectors (L / B) u_k as StackedGradients, the mean training
        loss and the fraction of users whose update exceeds B (clipped by the aggregator)."""
        users = active.nonzero().view(-1)
        u, losses = self._local_rows(users, self.weights, None if self.c_users is None else self.c[None, :])
        sent = u * self.scale
        grads = StackedGradients(sent, losses)
        return grads, float(losses.mean()), float((grads.norms > self.L).float().mean())

    def _local_rows(self, users: Tensor, weights: Tensor, c: Tensor | None) -> tuple[Tensor, Tensor]:
        """The S local steps of ``users`` (row indices) from ``weights`` ([d] or one row per user),
        SCAFFOLD's correction c - c_k from ``c`` ([1, d] or one row per user; None for FedAvg), whose
        c_k are then updated; returns (u [n, d], losses [n])."""
        correction = None if c is None else c - self.c_users.index_select(0, users)
        u, losses = local_updates(self.model, weights, self.x_train, self.y_train,
                                  self.index.index_select(0, users), self.counts.index_select(0, users),
                                  self._draws(users, self.S, self.q), local_lr=self.lr, record_sampling=self.q,
                                  record_clip=self.C, step_noise=self.sigma, correction=correction,
                                  method=self.method, gradient_sums=self.gradient_sums, buffers=self.rows)
        if c is not None:
            self.c_users[users] = -u / (self.lr * self.S)
        return u, losses

    def apply(self, estimate: Tensor, *, participants: int, mu: float, unknown: bool) -> None:
        """Server step from the estimate of the mean transmit vector (L / B) u (``clip``: the mean
        clipped update)."""
        update = estimate / self.scale
        w = self.weights + self.server_lr * update
        torch.nn.utils.vector_to_parameters(w.to(self.params[0].dtype), self.params)
        if self.c is not None:
            users = self.c_users.shape[0]
            rho = min(1.0, (mu if unknown else participants) / users)
            self.c += rho * (-update / (self.lr * self.S) - self.c)

    def step_facts(self, *, credit_transmit_noise: bool, credit_co_users: bool = True, warm: bool = False) -> dict:
        """What the ``steps`` accountant reads of a round (:class:`~otafl.privacy.facts.RoundFacts`
        fields, docs/privacy/steps.md#steps): S, q, sigma, C, the update-clip failure, the share r of
        another participant's last-step noise that nothing carries on, and the factor
        (B / L) q D_min / (eta_l C) that turns the artificial and channel noise's transmit-unit std
        into the record's noise multiplier (0: not credited). ``warm``: SCAFFOLD's warm-start
        transmission (one full-batch step, eta_l = q = 1, bound B_w).

        What may be credited (docs/privacy/steps.md#steps-last-step-credit):

        * r = D_min / D_max for FedAvg where the aggregation sums the transmit vectors linearly
          (``credit_co_users``; not over skellam, ddg or pbm, whose per-user encodings are not
          linear), 0 for SCAFFOLD (its c_k keep every step's noise);
        * the artificial and channel noise where they reach the release
          (``credit_transmit_noise``), for FedAvg only: under SCAFFOLD the target's next round
          uses its own c_k, its step outputs *without* that noise, while the public c holds them
          *with* it, so a later round reveals c - c_k, the credited noise itself
          (:data:`SCAFFOLD_CREDITS_TRANSMIT_NOISE`, a switch for tests only, puts the unsound
          credit back).
        """
        d_min, d_max = float(self.counts.min()), float(self.counts.max())
        lr, q, bound, steps = (1.0, 1.0, self.warm_bound, 1) if warm else (self.lr, self.q, self.bound, self.S)
        scaffold = self.algorithm.control_variates
        linear = not self.clips  # a clipped update is not linear in the steps: no share of the sum is credited
        credit = linear and credit_transmit_noise and (not scaffold or SCAFFOLD_CREDITS_TRANSMIT_NOISE)
        to_record = (bound / self.L) * q * d_min / (lr * self.C) if credit else 0.0
        return dict(local_steps=steps, record_sampling=q, step_noise=self.sigma, record_clip=self.C,
                    update_clip_failure=self.update_clip_failure,
                    co_user_noise=d_min / d_max if linear and credit_co_users and not scaffold else 0.0,
                    transmit_to_record=to_record)

    def warm_start_gradients(self) -> tuple[StackedGradients, Tensor]:
        """SCAFFOLD-warm: every user's c_k = (sum over all its records of clipped gradients + noise) / D_k
        at the initial model (one DP step, q = 1); returns their transmit vectors (L / B_w) c_k
        and the all-users mask. Sets the users' c_k."""
        users = torch.arange(self.index.shape[0], device=self.index.device)
        u, losses = local_updates(self.model, self.weights, self.x_train, self.y_train, self.index, self.counts,
                                  self._draws(users, 1, 1.0), local_lr=1.0, record_sampling=1.0, record_clip=self.C,
                                  step_noise=self.sigma, method=self.method, gradient_sums=self.gradient_sums)
        self.c_users.copy_(-u)
        return StackedGradients(-u * self.warm_scale, losses), torch.ones_like(users, dtype=torch.bool)

    def apply_warm_start(self, estimate: Tensor) -> None:
        """The server's c = the estimated mean of the users' c_k."""
        self.c.copy_(estimate / self.warm_scale)


def build_local_steps(spec, run, x_train: Tensor, y_train: Tensor) -> LocalSteps | None:
    """The :class:`LocalSteps` of a spec and run setup (``None`` for ``fedsgd``)."""
    tr, tx = spec.train, spec.transmit
    if not ALGORITHMS[tr.algorithm].local:
        return None
    dev = x_train.device
    return LocalSteps(algorithm=tr.algorithm, model=run.model, x_train=x_train, y_train=y_train,
                      index=run.split.index.to(dev), counts=run.split.counts.to(dev), local_steps=tr.local_steps,
                      local_lr=tr.local_lr, server_lr=1.0 if tr.server_lr is None else tr.server_lr,
                      record_sampling=tr.record_sampling, record_clip=tx.record_clip, step_noise=tx.step_noise,
                      transmit_clip=tx.clip, warm_start=tr.scaffold_warm_start,
                      mask_generator=run.generators["data"], noise_generator=run.generators["local"],
                      update_scaling=tx.update_scaling)

