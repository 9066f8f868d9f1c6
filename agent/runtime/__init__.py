"""The composition root: start-up and shutdown through one exit stack, signals, systemd notify
and watchdog, journald logging, the built-in demo repository."""
