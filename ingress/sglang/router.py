"""SGLang's dialect: its `POST /generate` body (told apart from the seed's by `sampling_params` or `text`:
rulebook/sglang.py), parsed here and run by routes.py over the contract's lifecycle; app.py puts it on /generate
beside the seed's (ingress/edge/shared_path.py). SGLang's /classify shape is the classifier's router's
(ingress/classify/), its control routes ingress/weights/control.py's."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from ingress.backend import Backend
from ingress.edge.shared_path import Dialect, Raw
from ingress.errors import IngressError, located
from ingress.lifecycle import Lifecycle
from ingress.sglang.routes import SGLangGenerate
from ingress.sglang.schemas import SGLangBody
from ingress.sglang.translate import SamplingTypeError, parse
from rulebook import sglang as sg


def sglang_dialect(backend: Backend, lifecycle: Lifecycle) -> Dialect:
    """SGLang's /generate over `lifecycle` (the contract's error body, as SGLang's own server answers)."""
    routes = SGLangGenerate(backend, lifecycle)

    async def generate(request: Request, raw: Raw) -> Response:
        try:
            parsed = parse(raw)
        except IngressError as exc:
            return lifecycle.answer(exc)
        except ValidationError as exc:
            raise RequestValidationError(located(exc.errors(include_url=False), "body")) from exc
        except SamplingTypeError as exc:
            raise RequestValidationError(located(exc.errors, "body")) from exc
        return await routes.generate(parsed, request)

    return Dialect(handle=generate, body_schema=SGLangBody.model_json_schema(), claims=sg.is_sglang)
