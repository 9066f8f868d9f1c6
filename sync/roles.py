"""The four top-level TUF roles, in the order keys are created and reported."""

ROLES = ("root", "targets", "snapshot", "timestamp")
