"""Pure, batched privacy math on float64 torch tensors.

This subpackage never imports the training code (``otafl.fl``, ``otafl.data``,
``otafl.models``): the FL loop emits per-round facts and the accountants read them.
"""
