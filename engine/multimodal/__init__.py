"""Images in the engine: the request's image inputs, their placeholder runs, M-RoPE positions and each request's
vision state."""
