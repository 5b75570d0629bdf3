"""The `kfactory` command line (kfactory.cli.main), and the exit statuses its commands share."""

#: a service or the host could not do it now; the same command may succeed later (sysexits' EX_UNAVAILABLE)
EXIT_UNAVAILABLE = 69
