"""The gateway's built-in plugins, one module or package each, registered as `modelgate.plugins`
entry points in pyproject.toml: the core finds them as it finds any other plugin."""
