"""Per-user minibatch gradients: their norms and their (clipped, weighted) sum.

User k's gradient is that of its weighted minibatch loss

    F_k(w) = sum_j weight[k, j] * CE(f_w(x[k, j]), y[k, j]) + (Omega / 2) ||w||^2,

with ``weight[k, j] = 1 / b_k`` on the user's b_k samples and 0 on padding, so F_k is the
mean cross-entropy over the user's minibatch, and g_k = grad F_k(w).

The over-the-air round never needs the g_k themselves: clipping and the power budget need
each user's norm ||g_k||, and the MAC delivers the sum sum_k c_k g_k of the transmitting
users' clipped gradients (c_k = min(1, L / ||g_k||)). :class:`UserGradients` is exactly
that interface (``norms``, ``losses``, ``weighted_sum(coef)``, and ``materialise()`` for the
per-user superposition path), with two implementations:

* :class:`StackedGradients` -- the g_k as a [n, d] tensor, from :func:`per_user_gradients`
  (``torch.func.vmap`` over users: any model, the reference and the fallback);
* :class:`GhostGradients` -- from :func:`ghost_gradients`: one forward and one backward
  pass over all n b samples, no [n, d] tensor. For ``nn.Sequential`` stacks of
  ``nn.Linear`` and element-wise activations only.

Ghost norms and the book-kept sum
---------------------------------
For a linear layer z = W a + beta and one user with samples j = 1..b, let a_j [F_in] be
the layer's input and delta_j = dF_k / dz_j [F_out] (already weighted by weight[k, j]).
The user's layer gradient is

    G = sum_j delta_j a_j^T  [F_out, F_in],      g_beta = sum_j delta_j  [F_out],

and the squared norm of G needs only two b x b Gram matrices (Goodfellow 2015, "Efficient
per-example gradient computations"; Li et al. 2022, "Large language models can be strong
differentially private learners", ghost clipping):

    ||G||_F^2 = sum_{j, j'} (a_j . a_j') (delta_j . delta_j'),

while g_beta (F_out numbers per user) is always formed.

That costs b^2 (F_in + F_out) per user, against b F_in F_out for materialising G; each
layer takes the cheaper (:func:`layer_method`). Materialised G_k are kept for the sum while
they are few; beyond that they are formed a cache-sized block of users at a time and reduced
to norms (and, given the clip norm, to the clipped sum) in cache (:mod:`otafl.fl.blocks`).
The per-sample output
gradients delta_j scale linearly with the sample's loss weight (samples do not interact in
these models), so the weighted sum over users is one matrix product per layer,

    sum_k coef_k G_k = sum_{k, j} (coef_k delta_kj) a_kj^T,

the same product an ordinary backward pass computes for the weight gradient: no second
backward pass is needed (the "book-keeping" trick of Bu et al. 2023, "Differentially
private optimization on large model at small cost", ICML).

The first linear layer's inputs are the raw features, whose inner products do not depend on
w: :class:`~otafl.fl.sketch.InputSketch` factors every user's local Gram matrix once per run into short
per-sample vectors phi_j with phi_j . phi_j' = x_j . x_j' (r = min(max_k D_k, F) coordinates), so
the first layer's norm is that of the small [F_out, r] matrix sum_j delta_j phi_j^T,
n b F_out (r + 1) per round (with a constant coordinate appended, the bias gradient comes out of
the same product).

Weight decay adds Omega w to every g_k, so ||g_k + Omega w||^2 = ||g_k||^2 +
2 Omega <w, g_k> + Omega^2 ||w||^2, and the cross term needs no g_k either: per layer,
<W, G> + <beta, g_beta> = sum_j delta_j . (W a_j + beta) = sum_j delta_j . z_j.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from otafl.errors import OtaflInputError
from otafl.fl import blocks

__all__ = ["ELEMENTWISE", "GhostGradients", "StackedGradients", "UserGradients", "flatten", "ghost_gradients",
           "layer_method", "param_dict", "per_user_gradients", "supports_ghost", "user_gradients"]

#: Parameter-free, per-sample, element-wise modules the ghost path can pass through.
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.ELU, nn.SiLU,
               nn.Softplus, nn.Identity)

#: Gradient methods of :func:`user_gradients`.
GRADIENT_METHODS = ("auto", "ghost", "vmap")


def param_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's parameters, detached, in registration order."""
    return {name: p.detach() for name, p in model.named_parameters()}


def flatten(tensors: dict[str, Tensor], batch_dims: int = 0) -> Tensor:
    """Concatenate parameter-shaped tensors into ``[*batch, d]`` (registration order)."""
    return torch.cat([t.reshape(*t.shape[:batch_dims], -1) for t in tensors.values()], dim=-1)


def per_user_gradients(model: nn.Module, x: Tensor, y: Tensor, weight: Tensor, *,
                       weight_decay: float = 0.0) -> tuple[Tensor, Tensor]:
    """Every user's minibatch gradient and loss at the model's current weights.

    ``torch.func.vmap`` over the user dimension computes every g_k(w) at once: no Python
    loop over users. Works for any functional model; :func:`ghost_gradients` is faster
    where it applies.

    Parameters
    ----------
    model : nn.Module
        Evaluated functionally at its current parameters (they are not modified).
    x : [K, b, F] float32
        Each user's minibatch features.
    y : [K, b] int64
        Labels.
    weight : [K, b] float32
        Per-sample loss weights (1/b_k on real samples, 0 on padding).
    weight_decay : float
        Omega; adds Omega * w to every gradient.

    Returns
    -------
    grads : [K, d] float32
        g_k(w_t), flattened in parameter registration order.
    losses : [K] float32
        The users' weighted minibatch cross-entropy (without the regulariser).
    """
    params = param_dict(model)

    def user_loss(p: dict[str, Tensor], xk: Tensor, yk: Tensor, wk: Tensor) -> tuple[Tensor, Tensor]:
        logits = functional_call(model, p, (xk,))
        ce = (torch.nn.functional.cross_entropy(logits, yk, reduction="none") * wk).sum()
        total = ce
        if weight_decay:
            total = total + 0.5 * weight_decay * sum((v * v).sum() for v in p.values())
        return total, ce

    grad_fn = vmap(grad_and_value(user_loss, has_aux=True), in_dims=(None, 0, 0, 0))
    grads, (_, ce) = grad_fn(params, x, y, weight)
    return flatten(grads, batch_dims=1), ce


def _take(t: Tensor, rows: Tensor | slice) -> Tensor:
    """Rows of ``t`` along dim 0: a view for a slice, a gather for int64 indices."""
    return t[rows] if isinstance(rows, slice) else t.index_select(0, rows)


class UserGradients:
    """The n users' gradients g_k [d] as the round uses them.

    Attributes
    ----------
    norms : [n], ||g_k||_2 before clipping (weight decay included).
    losses : [n], each user's weighted minibatch cross-entropy.
    dim : int, d.
    """

    norms: Tensor
    losses: Tensor
    dim: int

    def weighted_sum(self, coef: Tensor) -> Tensor:
        """sum_k coef_k g_k -> [d]; ``coef`` [n] (clip factors times who transmits)."""
        raise NotImplementedError

    def materialise(self) -> Tensor:
        """All g_k as one [n, d] tensor (the per-user superposition path)."""
        raise NotImplementedError

    def materialise_rows(self, rows: Tensor | slice, coef: Tensor | None = None,
                         out: Tensor | None = None, columns: Tensor | None = None) -> Tensor:
        """``coef_k g_k`` of the users ``rows`` (int64 indices into the n users, or a slice)
        as a [len(rows), d] tensor (the digital round, block by block); ``coef`` [len(rows)]
        scales each row (None: 1), ``columns`` [d] each column (None: 1). With ``out``
        ([len(rows), D >= d]) the rows are written into its first d columns and ``out`` is
        returned; otherwise a new tensor."""
        block = _take(self.materialise(), rows)
        block = block * coef.to(block.dtype)[:, None] if coef is not None else block.clone()
        if columns is not None:
            block.mul_(columns.to(block.dtype))
        if out is None:
            return block
        out[:, :block.shape[1]].copy_(block)
        return out


class StackedGradients(UserGradients):
    """Gradients held as a [n, d] tensor (from :func:`per_user_gradients` or a loop)."""

    def __init__(self, grads: Tensor, losses: Tensor | None = None):
        self.grads = grads
        self.norms = torch.linalg.vector_norm(grads, dim=-1)
        self.losses = grads.new_full((grads.shape[0],), math.nan) if losses is None else losses
        self.dim = int(grads.shape[-1])

    def weighted_sum(self, coef: Tensor) -> Tensor:
        return coef.to(self.grads.dtype) @ self.grads

    def materialise(self) -> Tensor:
        return self.grads


@dataclass
class _LinearTerm:
    """One linear layer's per-user factors.

    inputs : [n, b, F_in] a_kj;  deltas : [n, b, F_out] delta_kj (loss-weighted);
    weight_grads : [n, F_out, F_in] G_k when materialised and kept (at most
    :data:`otafl.fl.blocks.KEEP_FLOATS` numbers), else None;  bias_grads : [n, F_out] g_beta_k
    (always materialised: F_out numbers per user), None without a bias;  method : how the norms
    were taken (:func:`layer_method`);  clipped : (c [n], vec(sum_k c_k G_k)) accumulated block
    by block with the clip factors c_k, or None.
    """

    inputs: Tensor
    deltas: Tensor
    weight_grads: Tensor | None
    bias_grads: Tensor | None
    method: str
    clipped: tuple[Tensor, Tensor] | None = None

    def per_user(self) -> list[Tensor]:
        """[G_k flattened [n, F_out F_in], g_beta_k [n, F_out] (with a bias)]."""
        gw = self.weight_grads
        if gw is None:
            gw = torch.bmm(self.deltas.transpose(1, 2), self.inputs)
        return [gw.flatten(1)] + ([self.bias_grads] if self.bias_grads is not None else [])

    def weighted_sum(self, coef: Tensor) -> list[Tensor]:
        """[vec(sum_k coef_k G_k), sum_k coef_k g_beta_k (with a bias)]."""
        if self.clipped is not None and torch.equal(coef, self.clipped[0]):
            pieces = [self.clipped[1]]  # summed with exactly these factors while its blocks were in cache
        elif self.weight_grads is not None:
            pieces = [coef @ self.weight_grads.flatten(1)]
        else:  # book-keeping: the weight gradient of a backward pass with sample weights coef_k
            n, b, f_out = self.deltas.shape
            scaled = (self.deltas * coef.view(n, 1, 1)).view(n * b, f_out)
            pieces = [(scaled.T @ self.inputs.reshape(n * b, -1)).view(-1)]
        if self.bias_grads is not None:
            pieces.append(coef @ self.bias_grads)
        return pieces


class GhostGradients(UserGradients):
    """Gradients kept as per-layer factors (inputs, output gradients); see the module doc.

    Built by :func:`ghost_gradients`; ``weighted_sum`` costs one weight-gradient product
    per layer, ``materialise`` builds the [n, d] tensor only when asked.
    """

    def __init__(self, terms: list[_LinearTerm], norms: Tensor, losses: Tensor, dim: int,
                 weight_decay: float = 0.0, flat_params: Tensor | None = None):
        self.terms = terms
        self.norms = norms
        self.losses = losses
        self.dim = int(dim)
        self.weight_decay = float(weight_decay)
        self.flat_params = flat_params  # [d], w; needed only with weight decay

    def weighted_sum(self, coef: Tensor) -> Tensor:
        if coef.dtype != self.norms.dtype:
            coef = coef.to(self.norms.dtype)
        total = torch.cat([piece for term in self.terms for piece in term.weighted_sum(coef)])
        if self.weight_decay:
            total.add_(self.flat_params, alpha=self.weight_decay * float(coef.sum()))
        return total

    def materialise(self) -> Tensor:
        grads = torch.cat([piece for term in self.terms for piece in term.per_user()], dim=1)
        if self.weight_decay:
            grads = grads + self.weight_decay * self.flat_params
        return grads

    def materialise_rows(self, rows: Tensor | slice, coef: Tensor | None = None,
                         out: Tensor | None = None, columns: Tensor | None = None) -> Tensor:
        # coef scales the small factors (output gradients, bias gradients) before the
        # products; each product is written into its columns of the block in the same pass
        # that applies ``columns``; a slice of users takes views (no gather)
        first = self.terms[0].inputs
        count = len(range(*rows.indices(first.shape[0]))) if isinstance(rows, slice) else rows.numel()
        if out is None:
            out = first.new_empty(count, self.dim)
        scale = None if coef is None else coef.to(first.dtype)
        cols = None if columns is None else columns.to(first.dtype)

        def put(piece: Tensor, start: int, width: int) -> None:  # out[:, start:start+width] = piece * cols
            target = out[:, start:start + width]
            if cols is None:
                target.copy_(piece)
            else:
                torch.mul(piece, cols[start:start + width], out=target)

        col = 0
        for t in self.terms:
            if t.weight_grads is None:
                deltas = _take(t.deltas, rows)
                if scale is not None:
                    deltas = deltas * scale.view(-1, 1, 1)
                f_out, f_in = deltas.shape[-1], t.inputs.shape[-1]
                # a contiguous product, written by ``put``: bmm into the strided block itself
                # falls back to a per-user loop
                put(torch.bmm(deltas.transpose(1, 2), _take(t.inputs, rows)).view(count, f_out * f_in),
                    col, f_out * f_in)
            else:
                gw = _take(t.weight_grads, rows).flatten(1)
                f_out, f_in = t.weight_grads.shape[1], t.weight_grads.shape[2]
                put(gw * scale[:, None] if scale is not None else gw, col, f_out * f_in)
            col += f_out * f_in
            if t.bias_grads is not None:
                gb = _take(t.bias_grads, rows)
                put(gb * scale[:, None] if scale is not None else gb, col, f_out)
                col += f_out
        if self.weight_decay:
            wd = torch.full((count, 1), self.weight_decay, dtype=out.dtype, device=out.device)
            if scale is not None:
                wd = wd * scale[:, None]
            w = self.flat_params.to(out.dtype)
            out[:, :self.dim].addcmul_(wd, (w * cols if cols is not None else w)[None, :])
        return out


def supports_ghost(model: nn.Module) -> bool:
    """True for an ``nn.Sequential`` of ``nn.Linear`` and :data:`ELEMENTWISE` modules (not in
    place) with at least one linear layer."""
    if not isinstance(model, nn.Sequential):
        return False
    linear = 0
    for module in model:
        if isinstance(module, nn.Linear):
            linear += 1
        elif not isinstance(module, ELEMENTWISE) or getattr(module, "inplace", False):
            return False
    return linear > 0


def layer_method(batch: int, in_features: int, out_features: int, *, sketch_rank: int | None = None,
                 ghost: bool | None = None) -> str:
    """How :func:`ghost_gradients` gets one linear layer's per-user norms.

    ``"sketch"`` (the first layer, with an :class:`~otafl.fl.sketch.InputSketch` of rank r):
    b F_out (r + 1) per user; ``"gram"``: b^2 (F_in + F_out); ``"materialise"``: b F_in F_out.
    The cheapest wins; ``ghost`` = True / False forces ``"gram"`` / ``"materialise"``.
    """
    if ghost is not None:
        return "gram" if ghost else "materialise"
    costs = {"materialise": batch * in_features * out_features,
             "gram": batch * batch * (in_features + out_features)}
    if sketch_rank is not None:
        costs["sketch"] = batch * out_features * (sketch_rank + 1)
    return min(costs, key=costs.get)


def _sqrt(x: Tensor) -> Tensor:
    """Element-wise sqrt of x >= 0, as 1 / rsqrt(x) (so sqrt(0) = 1 / inf = 0; <= 2 ulp).

    On CPU, ``torch.sqrt`` goes through MKL's vector-math library, which opens an OpenMP
    parallel region even for a few hundred elements (costly when the cores are shared);
    ``torch.rsqrt`` and ``reciprocal`` use ATen's own vectorised kernels.
    """
    return torch.rsqrt(x).reciprocal_()


def ghost_gradients(model: nn.Module, x: Tensor, y: Tensor, weight: Tensor, *,
                    weight_decay: float = 0.0, ghost: bool | None = None,
                    input_sketch: Tensor | None = None, clip: float | None = None) -> GhostGradients:
    """Per-user gradient norms, losses and a lazily summed gradient from one forward+backward.

    Same g_k as :func:`per_user_gradients` (see the module docstring for the equations),
    computed from a single forward pass over all n b samples and a single backward pass to
    the linear layers' outputs; no parameter gradient is formed.

    Parameters
    ----------
    model : nn.Sequential
        Must satisfy :func:`supports_ghost`; its parameters are not modified.
    x : [n, b, F], y : [n, b] int64, weight : [n, b]
        As in :func:`per_user_gradients`.
    weight_decay : float
        Omega >= 0.
    ghost : bool or None
        Force Gram-matrix norms (True) or materialised layer gradients (False) for every
        layer; ``None`` (default) picks the cheapest per layer (:func:`layer_method`).
    input_sketch : [n, b, r + 1] or None
        The minibatch's sketched features (:meth:`~otafl.fl.sketch.InputSketch.minibatch`); used by the first
        module when it is a linear layer.
    clip : float or None
        L, the clip norm the round will apply (factors L / max(||g_k||, L)): a layer
        materialised block by block then also sums its clipped G_k while each block is in
        cache, and ``weighted_sum`` uses that sum when given exactly those factors (any other
        coefficients are book-kept as usual).

    Returns
    -------
    GhostGradients with ``norms`` [n], ``losses`` [n] in the model's dtype.
    """
    if not supports_ghost(model):
        raise OtaflInputError(f"ghost_gradients needs an nn.Sequential of nn.Linear and element-wise "
                        f"activations; got {type(model).__name__}")
    n, b = y.shape
    h = x.reshape(n * b, -1)
    inputs, outputs, layers = [], [], []
    # the sketch is that of the raw features: only for a linear first module
    sketch = input_sketch if isinstance(next(iter(model)), nn.Linear) else None
    with torch.enable_grad():
        for module in model:
            if isinstance(module, nn.Linear):
                bias = module.bias.detach() if module.bias is not None else None
                inputs.append(h.detach())
                z = F.linear(h, module.weight.detach(), bias)
                if not z.requires_grad:  # the first layer: make its output the graph's leaf
                    z.requires_grad_(True)
                outputs.append(z)
                layers.append(module)
                h = z
            else:
                h = module(h)
        ce = F.cross_entropy(h, y.reshape(-1), reduction="none").view(n, b)
        losses = (ce * weight).sum(dim=1)
        deltas = torch.autograd.grad(losses.sum(), outputs)

    terms = []
    squares = []  # per-layer pieces of ||g_k||^2, [n] each
    deferred = []  # (its index in squares, in terms, delta, a) of the layers materialised block by block
    cross = []  # per-layer pieces of <w, g_k> (without the regulariser), with weight decay only
    dim = 0
    for i, (module, a, z, delta) in enumerate(zip(layers, inputs, outputs, deltas)):
        f_in, f_out = module.in_features, module.out_features
        a, delta = a.view(n, b, f_in), delta.view(n, b, f_out)
        has_bias = module.bias is not None
        known = sketch if i == 0 else None
        method = layer_method(b, f_in, f_out, ghost=ghost,
                              sketch_rank=None if known is None else known.shape[-1] - 1)
        gw = gb = None
        if method == "sketch":  # sum_j delta_j [phi_j, 1]^T: ||.||^2 = ||G_k||^2 + ||g_beta_k||^2
            phi = known.to(delta.dtype) if has_bias else known[..., :-1].to(delta.dtype)
            small = torch.bmm(delta.transpose(1, 2), phi)  # [n, F_out, r (+ 1)]
            squares.append(torch.linalg.vecdot(small.flatten(1), small.flatten(1)))
            if has_bias:
                gb = small[:, :, -1]
        else:
            if method == "gram":  # ||G_k||^2 = sum_{j, j'} (a_j . a_j') (delta_j . delta_j')
                gram_a = torch.bmm(a, a.transpose(1, 2))  # [n, b, b]
                gram_delta = torch.bmm(delta, delta.transpose(1, 2))
                squares.append(torch.linalg.vecdot(gram_a.flatten(1), gram_delta.flatten(1)))
            elif n * f_out * f_in <= blocks.KEEP_FLOATS:  # materialised, kept for the weighted sum
                gw = torch.bmm(delta.transpose(1, 2), a)  # [n, F_out, F_in]
                squares.append(torch.linalg.vecdot(gw.flatten(1), gw.flatten(1)))
            else:  # materialised a cache-sized block of users at a time (below), not kept
                deferred.append((len(squares), len(terms), delta, a))
                squares.append(None)
            if has_bias:
                gb = delta.sum(dim=1)  # [n, F_out]
                squares.append(torch.linalg.vecdot(gb, gb))
        terms.append(_LinearTerm(a, delta, gw, gb, method))
        dim += f_in * f_out + (f_out if has_bias else 0)
        if weight_decay:
            cross.append((delta * z.detach().view(n, b, f_out)).sum(dim=(1, 2)))

    flat_params = flatten(param_dict(model)) if weight_decay else None
    w_sq = flat_params.square().sum() if weight_decay else None

    def norms_of(parts: list[Tensor], cross_parts: list[Tensor]) -> Tensor:  # all users, or a block
        sq_norms = functools.reduce(torch.add, parts)
        if weight_decay:
            sq_norms = (sq_norms + 2.0 * weight_decay * functools.reduce(torch.add, cross_parts)
                        + weight_decay * weight_decay * w_sq)
        return _sqrt(sq_norms.clamp(min=0.0))

    fused = None
    if clip is not None and len(deferred) == 1:  # the clipped sum in the same pass as the norms
        pos, t, delta, a = deferred[0]
        squares[pos], factor, total = blocks.clipped_pass(delta, a, lambda i, j, sq: norms_of(
            [sq if k == pos else s[i:j] for k, s in enumerate(squares)], [c[i:j] for c in cross]), clip)
        fused = (t, factor, total)
    else:
        for pos, _, delta, a in deferred:
            squares[pos] = blocks.materialised_squares(delta, a)
    norms = norms_of(squares, cross)
    if fused is not None and torch.equal(fused[1], clip / norms.clamp(min=clip)):  # the factors the round takes
        terms[fused[0]].clipped = fused[1:]
    return GhostGradients(terms, norms, losses.detach(), dim, weight_decay, flat_params)


def user_gradients(model: nn.Module, x: Tensor, y: Tensor, weight: Tensor, *,
                   weight_decay: float = 0.0, method: str = "auto",
                   input_sketch: Tensor | None = None, clip: float | None = None) -> UserGradients:
    """Every user's gradient in the form the round consumes.

    ``method``: ``"ghost"`` (:func:`ghost_gradients`), ``"vmap"`` (:func:`per_user_gradients`)
    or ``"auto"`` (default): ghost where :func:`supports_ghost`, vmap otherwise.
    ``input_sketch`` (:meth:`~otafl.fl.sketch.InputSketch.minibatch`) and ``clip`` go to the ghost path (vmap ignores them).
    Shapes as in :func:`per_user_gradients`.
    """
    if method not in GRADIENT_METHODS:
        raise OtaflInputError(f"gradient method {method!r} is not one of: {', '.join(GRADIENT_METHODS)}")
    if method == "ghost" or (method == "auto" and supports_ghost(model)):
        return ghost_gradients(model, x, y, weight, weight_decay=weight_decay, input_sketch=input_sketch,
                               clip=clip)
    grads, losses = per_user_gradients(model, x, y, weight, weight_decay=weight_decay)
    return StackedGradients(grads, losses)
