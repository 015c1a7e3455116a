"""``python -m otafl`` runs the CLI."""

from otafl.cli.main import cli

if __name__ == "__main__":
    cli()
