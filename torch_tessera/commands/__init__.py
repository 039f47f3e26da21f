"""Subcommands of the ``tessera`` command line; each module defines ``add_arguments(parser)`` and ``run(args)``."""
