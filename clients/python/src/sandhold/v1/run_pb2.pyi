from sandhold.v1 import events_pb2 as _events_pb2
from sandhold.v1 import sandbox_pb2 as _sandbox_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_INTERRUPTED: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_ABORTED: _ClassVar[RunStatus]
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_INTERRUPTED: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_ABORTED: RunStatus

class StartAttemptsRequest(_message.Message):
    __slots__ = ("run", "count", "attempts")
    RUN_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    run: StartRunRequest
    count: int
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptSpec]
    def __init__(self, run: _Optional[_Union[StartRunRequest, _Mapping]] = ..., count: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[AttemptSpec, _Mapping]]] = ...) -> None: ...

class AttemptSpec(_message.Message):
    __slots__ = ("harness", "model")
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    harness: str
    model: str
    def __init__(self, harness: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class StartAttemptsResponse(_message.Message):
    __slots__ = ("set",)
    SET_FIELD_NUMBER: _ClassVar[int]
    set: AttemptSet
    def __init__(self, set: _Optional[_Union[AttemptSet, _Mapping]] = ...) -> None: ...

class GetAttemptSetRequest(_message.Message):
    __slots__ = ("attempt_set_id",)
    ATTEMPT_SET_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_set_id: str
    def __init__(self, attempt_set_id: _Optional[str] = ...) -> None: ...

class GetAttemptSetResponse(_message.Message):
    __slots__ = ("set",)
    SET_FIELD_NUMBER: _ClassVar[int]
    set: AttemptSet
    def __init__(self, set: _Optional[_Union[AttemptSet, _Mapping]] = ...) -> None: ...

class AttemptSet(_message.Message):
    __slots__ = ("attempt_set_id", "thread_id", "definition_id", "base_checkpoint_id", "attempts", "promoted_run_id", "created_at_ms")
    ATTEMPT_SET_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    attempt_set_id: str
    thread_id: str
    definition_id: str
    base_checkpoint_id: str
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    promoted_run_id: str
    created_at_ms: int
    def __init__(self, attempt_set_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., definition_id: _Optional[str] = ..., base_checkpoint_id: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., promoted_run_id: _Optional[str] = ..., created_at_ms: _Optional[int] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt", "run_id", "thread_id", "harness", "model", "status", "evaluated", "files_changed", "lines_added", "lines_removed", "files", "test_exit_code", "test_output_tail", "test_error", "usage", "duration_ms", "checkpoint_id", "error")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_FIELD_NUMBER: _ClassVar[int]
    FILES_CHANGED_FIELD_NUMBER: _ClassVar[int]
    LINES_ADDED_FIELD_NUMBER: _ClassVar[int]
    LINES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TEST_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TEST_OUTPUT_TAIL_FIELD_NUMBER: _ClassVar[int]
    TEST_ERROR_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    run_id: str
    thread_id: str
    harness: str
    model: str
    status: RunStatus
    evaluated: bool
    files_changed: int
    lines_added: int
    lines_removed: int
    files: _containers.RepeatedCompositeFieldContainer[ChangedFile]
    test_exit_code: int
    test_output_tail: str
    test_error: str
    usage: _events_pb2.Usage
    duration_ms: int
    checkpoint_id: str
    error: str
    def __init__(self, attempt: _Optional[int] = ..., run_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., harness: _Optional[str] = ..., model: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., evaluated: _Optional[bool] = ..., files_changed: _Optional[int] = ..., lines_added: _Optional[int] = ..., lines_removed: _Optional[int] = ..., files: _Optional[_Iterable[_Union[ChangedFile, _Mapping]]] = ..., test_exit_code: _Optional[int] = ..., test_output_tail: _Optional[str] = ..., test_error: _Optional[str] = ..., usage: _Optional[_Union[_events_pb2.Usage, _Mapping]] = ..., duration_ms: _Optional[int] = ..., checkpoint_id: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ChangedFile(_message.Message):
    __slots__ = ("path", "change", "lines_added", "lines_removed", "binary")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    LINES_ADDED_FIELD_NUMBER: _ClassVar[int]
    LINES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    path: str
    change: str
    lines_added: int
    lines_removed: int
    binary: bool
    def __init__(self, path: _Optional[str] = ..., change: _Optional[str] = ..., lines_added: _Optional[int] = ..., lines_removed: _Optional[int] = ..., binary: _Optional[bool] = ...) -> None: ...

class GetAttemptPatchRequest(_message.Message):
    __slots__ = ("attempt_set_id", "run_id")
    ATTEMPT_SET_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_set_id: str
    run_id: str
    def __init__(self, attempt_set_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class GetAttemptPatchResponse(_message.Message):
    __slots__ = ("patch", "truncated")
    PATCH_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    patch: str
    truncated: bool
    def __init__(self, patch: _Optional[str] = ..., truncated: _Optional[bool] = ...) -> None: ...

class PromoteAttemptRequest(_message.Message):
    __slots__ = ("attempt_set_id", "run_id")
    ATTEMPT_SET_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_set_id: str
    run_id: str
    def __init__(self, attempt_set_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class PromoteAttemptResponse(_message.Message):
    __slots__ = ("set", "checkpoint_id")
    SET_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    set: AttemptSet
    checkpoint_id: str
    def __init__(self, set: _Optional[_Union[AttemptSet, _Mapping]] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class HarnessOptions(_message.Message):
    __slots__ = ("program", "command", "model", "resume_session_id", "permission_mode", "max_turns", "allowed_tools", "disallowed_tools", "system_prompt", "mcp_config_path", "include_partial_messages", "sandbox_mode", "config_overrides", "extra_args", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESUME_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    DISALLOWED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MCP_CONFIG_PATH_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PARTIAL_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_MODE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    EXTRA_ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    program: str
    command: _containers.RepeatedScalarFieldContainer[str]
    model: str
    resume_session_id: str
    permission_mode: str
    max_turns: int
    allowed_tools: _containers.RepeatedScalarFieldContainer[str]
    disallowed_tools: _containers.RepeatedScalarFieldContainer[str]
    system_prompt: str
    mcp_config_path: str
    include_partial_messages: bool
    sandbox_mode: str
    config_overrides: _containers.RepeatedCompositeFieldContainer[ConfigOverride]
    extra_args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    def __init__(self, program: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., resume_session_id: _Optional[str] = ..., permission_mode: _Optional[str] = ..., max_turns: _Optional[int] = ..., allowed_tools: _Optional[_Iterable[str]] = ..., disallowed_tools: _Optional[_Iterable[str]] = ..., system_prompt: _Optional[str] = ..., mcp_config_path: _Optional[str] = ..., include_partial_messages: _Optional[bool] = ..., sandbox_mode: _Optional[str] = ..., config_overrides: _Optional[_Iterable[_Union[ConfigOverride, _Mapping]]] = ..., extra_args: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ConfigOverride(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ("thread_id", "run_id", "definition_id", "secrets", "harness", "options", "prompt", "durable", "detach_on_disconnect", "cwd", "new_session", "policy", "client_tools", "budget")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    DETACH_ON_DISCONNECT_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    NEW_SESSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TOOLS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    run_id: str
    definition_id: str
    secrets: _containers.ScalarMap[str, str]
    harness: str
    options: HarnessOptions
    prompt: str
    durable: bool
    detach_on_disconnect: bool
    cwd: str
    new_session: bool
    policy: _sandbox_pb2.SandboxPolicy
    client_tools: _containers.RepeatedCompositeFieldContainer[ClientTool]
    budget: _sandbox_pb2.Budget
    def __init__(self, thread_id: _Optional[str] = ..., run_id: _Optional[str] = ..., definition_id: _Optional[str] = ..., secrets: _Optional[_Mapping[str, str]] = ..., harness: _Optional[str] = ..., options: _Optional[_Union[HarnessOptions, _Mapping]] = ..., prompt: _Optional[str] = ..., durable: _Optional[bool] = ..., detach_on_disconnect: _Optional[bool] = ..., cwd: _Optional[str] = ..., new_session: _Optional[bool] = ..., policy: _Optional[_Union[_sandbox_pb2.SandboxPolicy, _Mapping]] = ..., client_tools: _Optional[_Iterable[_Union[ClientTool, _Mapping]]] = ..., budget: _Optional[_Union[_sandbox_pb2.Budget, _Mapping]] = ...) -> None: ...

class ClientTool(_message.Message):
    __slots__ = ("name", "description", "input_schema_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ...) -> None: ...

class RespondToRequestRequest(_message.Message):
    __slots__ = ("run_id", "request_id", "permission", "tool_result")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    request_id: str
    permission: PermissionAnswer
    tool_result: ToolResult
    def __init__(self, run_id: _Optional[str] = ..., request_id: _Optional[str] = ..., permission: _Optional[_Union[PermissionAnswer, _Mapping]] = ..., tool_result: _Optional[_Union[ToolResult, _Mapping]] = ...) -> None: ...

class PermissionAnswer(_message.Message):
    __slots__ = ("allow", "message", "always", "scope")
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ALWAYS_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    allow: bool
    message: str
    always: bool
    scope: str
    def __init__(self, allow: _Optional[bool] = ..., message: _Optional[str] = ..., always: _Optional[bool] = ..., scope: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("content", "is_error")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    content: str
    is_error: bool
    def __init__(self, content: _Optional[str] = ..., is_error: _Optional[bool] = ...) -> None: ...

class RespondToRequestResponse(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: RunRequest
    def __init__(self, request: _Optional[_Union[RunRequest, _Mapping]] = ...) -> None: ...

class ListRequestsRequest(_message.Message):
    __slots__ = ("run_id", "include_answered")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    include_answered: bool
    def __init__(self, run_id: _Optional[str] = ..., include_answered: _Optional[bool] = ...) -> None: ...

class ListRequestsResponse(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RunRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[RunRequest, _Mapping]]] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("request_id", "kind", "tool", "input_json", "rule", "tool_call_id", "deadline_ms", "offset", "answer")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: str
    tool: str
    input_json: str
    rule: str
    tool_call_id: str
    deadline_ms: int
    offset: str
    answer: RequestAnswer
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[str] = ..., tool: _Optional[str] = ..., input_json: _Optional[str] = ..., rule: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., deadline_ms: _Optional[int] = ..., offset: _Optional[str] = ..., answer: _Optional[_Union[RequestAnswer, _Mapping]] = ...) -> None: ...

class RequestAnswer(_message.Message):
    __slots__ = ("allowed", "message", "is_error", "answered_by", "scope")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    message: str
    is_error: bool
    answered_by: str
    scope: str
    def __init__(self, allowed: _Optional[bool] = ..., message: _Optional[str] = ..., is_error: _Optional[bool] = ..., answered_by: _Optional[str] = ..., scope: _Optional[str] = ...) -> None: ...

class AttachRunRequest(_message.Message):
    __slots__ = ("run_id", "after_offset", "thread_id", "stored_only")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    STORED_ONLY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_offset: str
    thread_id: str
    stored_only: bool
    def __init__(self, run_id: _Optional[str] = ..., after_offset: _Optional[str] = ..., thread_id: _Optional[str] = ..., stored_only: _Optional[bool] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("chunk", "progress")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    chunk: RunChunk
    progress: _sandbox_pb2.EnsureProgress
    def __init__(self, chunk: _Optional[_Union[RunChunk, _Mapping]] = ..., progress: _Optional[_Union[_sandbox_pb2.EnsureProgress, _Mapping]] = ...) -> None: ...

class RunChunk(_message.Message):
    __slots__ = ("offset", "chunk")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    offset: str
    chunk: _events_pb2.Chunk
    def __init__(self, offset: _Optional[str] = ..., chunk: _Optional[_Union[_events_pb2.Chunk, _Mapping]] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class DeleteRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class DeleteRunResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("thread_id", "limit", "query", "status", "page_token")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    limit: int
    query: str
    status: RunStatus
    page_token: str
    def __init__(self, thread_id: _Optional[str] = ..., limit: _Optional[int] = ..., query: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetActiveRunRequest(_message.Message):
    __slots__ = ("thread_id",)
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    def __init__(self, thread_id: _Optional[str] = ...) -> None: ...

class GetActiveRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class RunFailure(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "thread_id", "status", "harness", "definition_id", "durable", "started_at_ms", "finished_at_ms", "error", "usage", "sandbox_id", "detached_since_ms", "cancel_requested", "forked_from_run", "session_id", "command", "prompt", "prompt_truncated")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    DETACHED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_RUN_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    thread_id: str
    status: RunStatus
    harness: str
    definition_id: str
    durable: bool
    started_at_ms: int
    finished_at_ms: int
    error: RunFailure
    usage: _events_pb2.Usage
    sandbox_id: str
    detached_since_ms: int
    cancel_requested: bool
    forked_from_run: str
    session_id: str
    command: _containers.RepeatedScalarFieldContainer[str]
    prompt: str
    prompt_truncated: bool
    def __init__(self, run_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., harness: _Optional[str] = ..., definition_id: _Optional[str] = ..., durable: _Optional[bool] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., error: _Optional[_Union[RunFailure, _Mapping]] = ..., usage: _Optional[_Union[_events_pb2.Usage, _Mapping]] = ..., sandbox_id: _Optional[str] = ..., detached_since_ms: _Optional[int] = ..., cancel_requested: _Optional[bool] = ..., forked_from_run: _Optional[str] = ..., session_id: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., prompt: _Optional[str] = ..., prompt_truncated: _Optional[bool] = ...) -> None: ...
