"""One module per ``fastpipe`` subcommand, each with ``add_parser(subparsers)``."""
