"""LoRA adapters at the ingress: which adapter a request names (select.py) and the routes that load and unload them
at run time, in vLLM's and SGLang's shapes (routes.py)."""
