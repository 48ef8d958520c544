"""The subcommands of ``python -m stability``, one module each; ``stability.cli`` wires them."""
