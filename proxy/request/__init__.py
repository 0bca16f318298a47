"""The path of one request, in order: target, body, model, the followed id, the pipeline, the forwarder, the relay."""
