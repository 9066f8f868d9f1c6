"""Ensembles: the pure plan (DAG checks) and the runner that executes its steps."""
