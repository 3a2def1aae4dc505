"""The OpenAPI 3.1 document of the gateway's OpenAI routes, generated from the pydantic request
models (`openai_types.py`) and served at `/openapi.json`."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from services.frontend import openai_types as wire

REF_TEMPLATE = "#/components/schemas/{model}"
OPERATIONS = (
    ("/v1/chat/completions", "createChatCompletion", wire.ChatCompletionRequest,
     "Chat completion (JSON, or server-sent events with `stream: true`)"),
    ("/v1/completions", "createCompletion", wire.CompletionRequest,
     "Text completion (JSON, or server-sent events with `stream: true`)"),
    ("/tokenize", "tokenize", wire.TokenizeRequest, "Token ids of a prompt or of chat messages"),
    ("/detokenize", "detokenize", wire.DetokenizeRequest, "Text of token ids"),
)
ERROR_STATUSES = {"400": "Invalid request (names the field)", "401": "Missing or wrong API key",
                  "404": "Unknown model", "413": "Request body over the server's limit",
                  "503": "Not ready, or the scheduler is unavailable"}


def openapi_document(title: str, version: str) -> dict[str, Any]:
    models: list[type[BaseModel]] = [model for _, _, model, _ in OPERATIONS] + [wire.ErrorResponse]
    refs, schemas = models_json_schema([(model, "validation") for model in models],
                                       ref_template=REF_TEMPLATE)
    paths: dict[str, Any] = {path: {"post": _operation(operation_id, summary,
                                                       refs[(model, "validation")]["$ref"])}
                             for path, operation_id, model, summary in OPERATIONS}
    paths["/v1/models"] = {"get": {"operationId": "listModels", "summary": "The served model",
                                   "responses": {"200": _json_response("The model list", {})}}}
    return {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths,
            "components": {"schemas": schemas.get("$defs", {}),
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}


def _operation(operation_id: str, summary: str, request_ref: str) -> dict[str, Any]:
    error_ref = {"$ref": REF_TEMPLATE.format(model="ErrorResponse")}
    responses = {"200": _json_response("Success", {})}
    responses.update({status: _json_response(text, error_ref)
                      for status, text in ERROR_STATUSES.items()})
    return {"operationId": operation_id, "summary": summary,
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": {"$ref": request_ref}}}},
            "responses": responses}


def _json_response(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}
