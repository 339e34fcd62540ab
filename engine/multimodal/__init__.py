"""Images in the engine: the request's image inputs, their M-RoPE positions and each request's vision state."""

from engine.multimodal.image_input import ImageInput

__all__ = ["ImageInput"]
