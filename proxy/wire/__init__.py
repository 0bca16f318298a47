"""What the interface looks like on the wire: its routes as data, SSE and multipart framing, JSON."""
