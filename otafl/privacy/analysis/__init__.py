"""Pure privacy math: keyword-argument, batched float64 tensor functions (no accountant logic).

- :mod:`~otafl.privacy.analysis.gaussian`: classic and analytic Gaussian mechanism, its
  hockey-stick divergence, amplification by sampling.
- :mod:`~otafl.privacy.analysis.concentration`: the law of |K_t| (Poisson binomial),
  Hoeffding and exact quantiles.
- :mod:`~otafl.privacy.analysis.composition` and :mod:`~otafl.privacy.analysis.rdp`:
  basic, advanced and RDP (Opacus) composition over rounds.
- The over-the-air round of the ``exact`` accountant:
  :mod:`~otafl.privacy.analysis.mixture` (1-D mixture hockey stick),
  :mod:`~otafl.privacy.analysis.cells` (the norm statistic's cells, delta_n),
  :mod:`~otafl.privacy.analysis.count_law` (laws of the participant counts),
  :mod:`~otafl.privacy.analysis.ota_round` (delta(eps) and eps(delta) of a round),
  :mod:`~otafl.privacy.analysis.ota_rows` (rows per user group) and
  :mod:`~otafl.privacy.analysis.pld` (composition by privacy-loss distributions).

Nothing is imported here, so importing one module loads only what it needs.
"""
