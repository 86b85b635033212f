"""``accel`` subcommands that live in this package, registered through ``accel.commands``."""
