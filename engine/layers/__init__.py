"""Layers shared by the model families: norms, mixture-of-experts blocks, rotary variants, windowed and
soft-capped attention."""
