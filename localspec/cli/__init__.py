"""The `localspec` command: each subcommand a short module over the public API."""
