from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_TYPE_UNSPECIFIED: _ClassVar[ChunkType]
    CHUNK_TYPE_RUN_STARTED: _ClassVar[ChunkType]
    CHUNK_TYPE_TEXT_MESSAGE_START: _ClassVar[ChunkType]
    CHUNK_TYPE_TEXT_MESSAGE_CONTENT: _ClassVar[ChunkType]
    CHUNK_TYPE_TEXT_MESSAGE_END: _ClassVar[ChunkType]
    CHUNK_TYPE_REASONING_START: _ClassVar[ChunkType]
    CHUNK_TYPE_REASONING_CONTENT: _ClassVar[ChunkType]
    CHUNK_TYPE_REASONING_END: _ClassVar[ChunkType]
    CHUNK_TYPE_TOOL_CALL_START: _ClassVar[ChunkType]
    CHUNK_TYPE_TOOL_CALL_ARGS: _ClassVar[ChunkType]
    CHUNK_TYPE_TOOL_CALL_END: _ClassVar[ChunkType]
    CHUNK_TYPE_TOOL_CALL_RESULT: _ClassVar[ChunkType]
    CHUNK_TYPE_RUN_FINISHED: _ClassVar[ChunkType]
    CHUNK_TYPE_RUN_ERROR: _ClassVar[ChunkType]
    CHUNK_TYPE_CUSTOM: _ClassVar[ChunkType]
    CHUNK_TYPE_PERMISSION_REQUESTED: _ClassVar[ChunkType]
    CHUNK_TYPE_PERMISSION_RESOLVED: _ClassVar[ChunkType]
CHUNK_TYPE_UNSPECIFIED: ChunkType
CHUNK_TYPE_RUN_STARTED: ChunkType
CHUNK_TYPE_TEXT_MESSAGE_START: ChunkType
CHUNK_TYPE_TEXT_MESSAGE_CONTENT: ChunkType
CHUNK_TYPE_TEXT_MESSAGE_END: ChunkType
CHUNK_TYPE_REASONING_START: ChunkType
CHUNK_TYPE_REASONING_CONTENT: ChunkType
CHUNK_TYPE_REASONING_END: ChunkType
CHUNK_TYPE_TOOL_CALL_START: ChunkType
CHUNK_TYPE_TOOL_CALL_ARGS: ChunkType
CHUNK_TYPE_TOOL_CALL_END: ChunkType
CHUNK_TYPE_TOOL_CALL_RESULT: ChunkType
CHUNK_TYPE_RUN_FINISHED: ChunkType
CHUNK_TYPE_RUN_ERROR: ChunkType
CHUNK_TYPE_CUSTOM: ChunkType
CHUNK_TYPE_PERMISSION_REQUESTED: ChunkType
CHUNK_TYPE_PERMISSION_RESOLVED: ChunkType

class ChunkRequest(_message.Message):
    __slots__ = ("request_id", "kind", "rule", "deadline_ms", "input_json", "allowed", "answered_by", "awaiting_client", "scope")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    AWAITING_CLIENT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: str
    rule: str
    deadline_ms: int
    input_json: str
    allowed: bool
    answered_by: str
    awaiting_client: bool
    scope: str
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[str] = ..., rule: _Optional[str] = ..., deadline_ms: _Optional[int] = ..., input_json: _Optional[str] = ..., allowed: _Optional[bool] = ..., answered_by: _Optional[str] = ..., awaiting_client: _Optional[bool] = ..., scope: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "cost_usd")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    cost_usd: float
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("type", "run_id", "thread_id", "timestamp_ms", "message_id", "parent_message_id", "tool_call_id", "tool_name", "delta", "content", "is_error", "exit_code", "finish_reason", "usage", "error_message", "error_code", "name", "value_json", "request")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    type: ChunkType
    run_id: str
    thread_id: str
    timestamp_ms: int
    message_id: str
    parent_message_id: str
    tool_call_id: str
    tool_name: str
    delta: str
    content: str
    is_error: bool
    exit_code: int
    finish_reason: str
    usage: Usage
    error_message: str
    error_code: str
    name: str
    value_json: str
    request: ChunkRequest
    def __init__(self, type: _Optional[_Union[ChunkType, str]] = ..., run_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., message_id: _Optional[str] = ..., parent_message_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., delta: _Optional[str] = ..., content: _Optional[str] = ..., is_error: _Optional[bool] = ..., exit_code: _Optional[int] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., error_message: _Optional[str] = ..., error_code: _Optional[str] = ..., name: _Optional[str] = ..., value_json: _Optional[str] = ..., request: _Optional[_Union[ChunkRequest, _Mapping]] = ...) -> None: ...
