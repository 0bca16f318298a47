"""Payment webhooks held durably in Redis Streams and delivered to their backend in order."""
