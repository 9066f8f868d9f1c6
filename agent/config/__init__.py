"""The agent's configuration: schema (frozen dataclasses), one loader for file, environment and
flags, and the `config check/show` tools."""
