"""Command-line interface: a thin click group; each command calls library code."""
