"""The ``pgqueue`` command (Typer). The library never imports this package."""
