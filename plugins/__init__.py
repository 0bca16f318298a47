"""The gateway's built-in plugins, one module each (see proxy.pipeline.BUILTIN_PLUGINS)."""
