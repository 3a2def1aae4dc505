"""Pydantic v2 models of the OpenAI request bodies the gateway serves (chat and text completions,
/tokenize, /detokenize), and their validation into `RequestError`s.

The models state the wire types and ranges (the OpenAPI document at /openapi.json is generated
from them); what depends on the deployment (vocabulary size, greedy-only sampling, the served model
name, the server's bounds) is checked afterwards by `openai_request.py`. Validation is strict
(JSON types as sent: `"3"` is not an integer, `1` is not a boolean) and unknown fields are
allowed, as OpenAI clients send vendor fields. A validation failure is a 400 whose `param` is the
JSON path of the field (`messages[0].content[1].type`), never the 422 of frameworks, and whose
message never repeats the client's input.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.frontend.errors import RequestError

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 4
# A token id as a logit_bias key: digits only, at most 10 of them (ids are < 2^31).
TOKEN_ID_KEY = r"^[0-9]{1,10}$"
PARAM_SEGMENT_CHARS = 40

Count = Annotated[int, Field(ge=1, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=-INT32_MAX, le=INT32_MAX)]
Bias = Annotated[float, Field(ge=-100, le=100)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class TextContentPart(_Model):
    type: Literal["text"]
    text: str


class FunctionCall(_Model):
    name: str
    arguments: str = Field(description="the call's arguments as a JSON object text")


class ToolCall(_Model):
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: FunctionCall


class ChatMessage(_Model):
    role: Literal["system", "user", "developer", "assistant", "tool", "latest_reminder"]
    content: Union[str, list[TextContentPart], None] = None
    name: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None


class FunctionDefinition(_Model):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = Field(default=None, description="a JSON schema")
    strict: Optional[bool] = None


class Tool(_Model):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Model):
    name: Optional[str] = None
    description: Optional[str] = None
    json_schema: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StreamOptions(_Model):
    include_usage: Optional[bool] = None


class SamplingFields(_Model):
    """Fields shared by chat and text completions."""

    model: Optional[str] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)], None] = None
    max_tokens: Optional[Count] = None
    temperature: Optional[float] = Field(default=None, ge=0)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    top_k: Optional[Annotated[int, Field(ge=-1, le=INT32_MAX)]] = None
    n: Optional[Count] = None
    seed: Optional[Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    logit_bias: Optional[dict[Annotated[str, Field(pattern=TOKEN_ID_KEY)], Bias]] = None
    ignore_eos: Optional[bool] = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[Count] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[ResponseFormat] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=INT32_MAX)]] = None


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[TokenId], list[str], list[list[TokenId]]] = Field(
        description="text, or token ids; a list of one prompt is accepted")
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    best_of: Optional[Count] = None
    logprobs: Optional[Annotated[int, Field(ge=0, le=INT32_MAX)]] = None


class TokenizeRequest(_Model):
    """Either `prompt` or chat `messages` (with `tools` and `chat_template_kwargs`)."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    tools: Optional[list[Tool]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_generation_prompt: Optional[bool] = None
    continue_final_message: Optional[bool] = None
    add_special_tokens: Optional[bool] = None


class DetokenizeRequest(_Model):
    model: Optional[str] = None
    tokens: list[TokenId]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


M = TypeVar("M", bound=BaseModel)

# Pydantic puts the union member a value was tried against in an error's location; these are
# not fields of the request.
_MODEL_NAMES = frozenset(name for name, value in dict(globals()).items()
                         if isinstance(value, type) and issubclass(value, BaseModel))
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "[key]"})


def validate(model: type[M], body: dict[str, Any]) -> M:
    """`body` as a `model`, or a `RequestError` naming the first offending field."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise _request_error(error) from None


def _request_error(error: ValidationError) -> RequestError:
    """The deepest failure wins: for a union, the member whose shape the value had got furthest
    in (a content list whose part 1 has a bad `type`, rather than "not a string")."""
    located = [(_path(d["loc"]), d["msg"])
               for d in error.errors(include_url=False, include_input=False)]
    deepest = max(located, key=lambda item: len(item[0]))[0]
    messages = list(dict.fromkeys(msg for path, msg in located if path == deepest))
    param = error_param(deepest)
    return RequestError(f"Invalid `{param or 'body'}`: {'; or '.join(messages[:3])}.",
                        param or None)


def _path(loc: tuple[Union[int, str], ...]) -> tuple[Union[int, str], ...]:
    """The location without union-member tags."""
    return tuple(segment for segment in loc if isinstance(segment, int) or (
        segment not in _MODEL_NAMES and segment not in _TYPE_TAGS and "[" not in segment))


def error_param(path: tuple[Union[int, str], ...]) -> str:
    """A location as a JSON path: `messages[0].content[1].type`; long dict keys are cut short."""
    text = ""
    for segment in path:
        if isinstance(segment, int):
            text += f"[{segment}]"
        else:
            name = segment if len(segment) <= PARAM_SEGMENT_CHARS \
                else segment[:PARAM_SEGMENT_CHARS] + "…"
            text += f".{name}" if text else name
    return text
