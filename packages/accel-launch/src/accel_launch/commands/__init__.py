"""The ``accel`` subcommands, one module each; none imports torch at module level."""
