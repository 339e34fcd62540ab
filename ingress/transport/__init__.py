"""The transport: what the ingress needs of the worker deployment, over its Ray Serve handle (HandleBackend, the
one real Backend): the worker client (worker_client.py: streams, unary answers, the coalescer, many-request calls),
the text side (text_client.py: tokenizer, chat template, images) and the admin side (admin_client.py: registries,
weights, controls)."""

from ingress.transport.handle import HandleBackend

__all__ = ["HandleBackend"]
