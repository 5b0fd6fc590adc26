"""The `refinery` command: one module per group of subcommands, each registering its commands on
the one Typer ``app`` of ``curation.cli.app`` when imported (in this order: ``--help`` lists them so)."""

from curation.cli.app import app, main  # noqa: F401
from curation.cli import runs  # noqa: F401,E402,I001 (registration, in --help's order)
from curation.cli import serve  # noqa: F401,E402
from curation.cli import train  # noqa: F401,E402
from curation.cli import tokens  # noqa: F401,E402
from curation.cli import quality  # noqa: F401,E402
from curation.cli import evals  # noqa: F401,E402
from curation.cli import index  # noqa: F401,E402
