"""The floor every layer stands on: the records of one request (`Exchange`, `Outcome`,
`UpstreamResponse`, `AnswerLimit`, `PinRecord`, `Usage`), the plugin contract (`Plugin`), the
pipeline that runs it (`Pipeline`), the live config (`Runtime`) and the drain (`Drain`), with
the JSON codec and the header rules they share.

Nothing here imports another package of the project (annotations aside): the request path, the
plugins, observability and the process import this, never the other way round, as httpcore's
models sit under its connections and pool. What these records need of the layers above (a
format's errors, a tracer) they are handed, and reach through duck-typed attributes.
"""
