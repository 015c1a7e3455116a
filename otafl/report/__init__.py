"""Reports from sweep results: trade-off tables (``table``) and figures (``plots``)."""
