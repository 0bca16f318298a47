"""Image URL delivery: Base64 images stored and replaced by temporary signed URLs."""
