"""The process: the command, the server and its signals, worker processes, the app and what outlives a config."""
