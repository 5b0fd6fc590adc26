"""The `refinery` Typer app and what every command module shares: the consoles and how a
command fails."""

from __future__ import annotations


import typer
from rich.console import Console


app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="refinery: raw crawl dumps in, training-ready token shards out.")


console = Console()


err = Console(stderr=True)


def fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def main() -> None:  # pragma: no cover
    app()


def mib(n: float) -> str:
    """Bytes in the unit that reads best (B, KiB, MiB, GiB, TiB)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{int(n):,} B"
