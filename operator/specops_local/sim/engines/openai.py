"""The OpenAI-compatible completions API that trtllm-serve, vLLM and SGLang share."""

from __future__ import annotations

import itertools
import time

from aiohttp import web

from specops_local.sim.engines.base import BadRequest, SimEngine, float_field, int_field, json_body

_IDS = itertools.count(1)


class OpenAIEngine(SimEngine):
    """``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` (subclasses add their own)."""

    check_model_name = False
    """Whether a completion naming another model is refused (vLLM does: 404)."""

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_post("/v1/completions", self._handle_completions)

    def health_paths(self) -> frozenset[str]:
        return frozenset({"/health"})

    async def _handle_health(self, request: web.Request) -> web.Response:
        if not self.ready:
            return self.starting_response()
        return web.Response(status=200)

    async def _handle_models(self, request: web.Request) -> web.Response:
        name = self.config.served_model_name
        return web.json_response(
            {"object": "list", "data": [{"id": name, "object": "model", "owned_by": self.backend}]}
        )

    async def _handle_completions(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string")
        model = body.get("model", self.config.served_model_name)
        if self.check_model_name and model != self.config.served_model_name:
            raise BadRequest(f"The model `{model}` does not exist.", status=404)
        max_tokens = int_field(body, "max_tokens", 16)
        temperature = float_field(body, "temperature", 1.0)
        text = await self.complete(prompt, max_tokens, temperature)
        prompt_tokens = len(prompt.split())
        return web.json_response(
            {
                "id": f"cmpl-{self.name}-{next(_IDS)}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": max_tokens,
                    "total_tokens": prompt_tokens + max_tokens,
                },
            }
        )

    def error_response(self, status: int, message: str) -> web.Response:
        return web.json_response(
            {"object": "error", "message": message, "type": "BadRequestError", "code": status}, status=status
        )
