"""Library entry points behind the CLI commands, importable and testable without click."""
