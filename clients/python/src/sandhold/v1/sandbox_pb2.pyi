from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PolicyEffect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_EFFECT_UNSPECIFIED: _ClassVar[PolicyEffect]
    POLICY_EFFECT_ALLOW: _ClassVar[PolicyEffect]
    POLICY_EFFECT_ASK: _ClassVar[PolicyEffect]
    POLICY_EFFECT_DENY: _ClassVar[PolicyEffect]

class PolicyAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_ACTION_UNSPECIFIED: _ClassVar[PolicyAction]
    POLICY_ACTION_COMMAND: _ClassVar[PolicyAction]
    POLICY_ACTION_FILE_WRITE: _ClassVar[PolicyAction]
    POLICY_ACTION_NETWORK: _ClassVar[PolicyAction]

class Reuse(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REUSE_UNSPECIFIED: _ClassVar[Reuse]
    REUSE_THREAD: _ClassVar[Reuse]
    REUSE_NONE: _ClassVar[Reuse]

class SnapshotPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SNAPSHOT_POLICY_UNSPECIFIED: _ClassVar[SnapshotPolicy]
    SNAPSHOT_POLICY_AFTER_SETUP: _ClassVar[SnapshotPolicy]
    SNAPSHOT_POLICY_NEVER: _ClassVar[SnapshotPolicy]

class EnsurePhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENSURE_PHASE_UNSPECIFIED: _ClassVar[EnsurePhase]
    ENSURE_PHASE_RESOLVING: _ClassVar[EnsurePhase]
    ENSURE_PHASE_RESUMING: _ClassVar[EnsurePhase]
    ENSURE_PHASE_RESTORING_SNAPSHOT: _ClassVar[EnsurePhase]
    ENSURE_PHASE_CREATING: _ClassVar[EnsurePhase]
    ENSURE_PHASE_CLONING: _ClassVar[EnsurePhase]
    ENSURE_PHASE_SETUP: _ClassVar[EnsurePhase]
    ENSURE_PHASE_PROJECTING: _ClassVar[EnsurePhase]
    ENSURE_PHASE_SNAPSHOTTING: _ClassVar[EnsurePhase]
    ENSURE_PHASE_RESTORING_CHECKPOINT: _ClassVar[EnsurePhase]

class EnsureOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENSURE_OUTCOME_UNSPECIFIED: _ClassVar[EnsureOutcome]
    ENSURE_OUTCOME_CREATED: _ClassVar[EnsureOutcome]
    ENSURE_OUTCOME_RESUMED: _ClassVar[EnsureOutcome]
    ENSURE_OUTCOME_SNAPSHOT_RESTORED: _ClassVar[EnsureOutcome]
    ENSURE_OUTCOME_CLAIMED: _ClassVar[EnsureOutcome]

class SandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_STATE_UNSPECIFIED: _ClassVar[SandboxState]
    SANDBOX_STATE_RUNNING: _ClassVar[SandboxState]
    SANDBOX_STATE_STOPPED: _ClassVar[SandboxState]
    SANDBOX_STATE_MISSING: _ClassVar[SandboxState]

class OutputStream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_STREAM_UNSPECIFIED: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDOUT: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDERR: _ClassVar[OutputStream]

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE_TYPE_FILE: _ClassVar[FileType]
    FILE_TYPE_DIRECTORY: _ClassVar[FileType]
    FILE_TYPE_SYMLINK: _ClassVar[FileType]
    FILE_TYPE_OTHER: _ClassVar[FileType]

class FileEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_EVENT_TYPE_UNSPECIFIED: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_CREATE: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_CHANGE: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_DELETE: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_RENAME: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_RESCAN: _ClassVar[FileEventType]

class GitChange(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GIT_CHANGE_UNSPECIFIED: _ClassVar[GitChange]
    GIT_CHANGE_UNMODIFIED: _ClassVar[GitChange]
    GIT_CHANGE_MODIFIED: _ClassVar[GitChange]
    GIT_CHANGE_ADDED: _ClassVar[GitChange]
    GIT_CHANGE_DELETED: _ClassVar[GitChange]
    GIT_CHANGE_RENAMED: _ClassVar[GitChange]
    GIT_CHANGE_COPIED: _ClassVar[GitChange]
    GIT_CHANGE_TYPE_CHANGED: _ClassVar[GitChange]
    GIT_CHANGE_UNMERGED: _ClassVar[GitChange]
    GIT_CHANGE_UNTRACKED: _ClassVar[GitChange]
POLICY_EFFECT_UNSPECIFIED: PolicyEffect
POLICY_EFFECT_ALLOW: PolicyEffect
POLICY_EFFECT_ASK: PolicyEffect
POLICY_EFFECT_DENY: PolicyEffect
POLICY_ACTION_UNSPECIFIED: PolicyAction
POLICY_ACTION_COMMAND: PolicyAction
POLICY_ACTION_FILE_WRITE: PolicyAction
POLICY_ACTION_NETWORK: PolicyAction
REUSE_UNSPECIFIED: Reuse
REUSE_THREAD: Reuse
REUSE_NONE: Reuse
SNAPSHOT_POLICY_UNSPECIFIED: SnapshotPolicy
SNAPSHOT_POLICY_AFTER_SETUP: SnapshotPolicy
SNAPSHOT_POLICY_NEVER: SnapshotPolicy
ENSURE_PHASE_UNSPECIFIED: EnsurePhase
ENSURE_PHASE_RESOLVING: EnsurePhase
ENSURE_PHASE_RESUMING: EnsurePhase
ENSURE_PHASE_RESTORING_SNAPSHOT: EnsurePhase
ENSURE_PHASE_CREATING: EnsurePhase
ENSURE_PHASE_CLONING: EnsurePhase
ENSURE_PHASE_SETUP: EnsurePhase
ENSURE_PHASE_PROJECTING: EnsurePhase
ENSURE_PHASE_SNAPSHOTTING: EnsurePhase
ENSURE_PHASE_RESTORING_CHECKPOINT: EnsurePhase
ENSURE_OUTCOME_UNSPECIFIED: EnsureOutcome
ENSURE_OUTCOME_CREATED: EnsureOutcome
ENSURE_OUTCOME_RESUMED: EnsureOutcome
ENSURE_OUTCOME_SNAPSHOT_RESTORED: EnsureOutcome
ENSURE_OUTCOME_CLAIMED: EnsureOutcome
SANDBOX_STATE_UNSPECIFIED: SandboxState
SANDBOX_STATE_RUNNING: SandboxState
SANDBOX_STATE_STOPPED: SandboxState
SANDBOX_STATE_MISSING: SandboxState
OUTPUT_STREAM_UNSPECIFIED: OutputStream
OUTPUT_STREAM_STDOUT: OutputStream
OUTPUT_STREAM_STDERR: OutputStream
FILE_TYPE_UNSPECIFIED: FileType
FILE_TYPE_FILE: FileType
FILE_TYPE_DIRECTORY: FileType
FILE_TYPE_SYMLINK: FileType
FILE_TYPE_OTHER: FileType
FILE_EVENT_TYPE_UNSPECIFIED: FileEventType
FILE_EVENT_TYPE_CREATE: FileEventType
FILE_EVENT_TYPE_CHANGE: FileEventType
FILE_EVENT_TYPE_DELETE: FileEventType
FILE_EVENT_TYPE_RENAME: FileEventType
FILE_EVENT_TYPE_RESCAN: FileEventType
GIT_CHANGE_UNSPECIFIED: GitChange
GIT_CHANGE_UNMODIFIED: GitChange
GIT_CHANGE_MODIFIED: GitChange
GIT_CHANGE_ADDED: GitChange
GIT_CHANGE_DELETED: GitChange
GIT_CHANGE_RENAMED: GitChange
GIT_CHANGE_COPIED: GitChange
GIT_CHANGE_TYPE_CHANGED: GitChange
GIT_CHANGE_UNMERGED: GitChange
GIT_CHANGE_UNTRACKED: GitChange

class SandboxDefinition(_message.Message):
    __slots__ = ("id", "provider", "workspace", "lifecycle", "env", "secret_names", "max_journal_bytes", "model_access", "network", "policy", "budget", "placement")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SECRET_NAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_ACCESS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    provider: ProviderSpec
    workspace: WorkspaceDefinition
    lifecycle: Lifecycle
    env: _containers.ScalarMap[str, str]
    secret_names: _containers.RepeatedScalarFieldContainer[str]
    max_journal_bytes: int
    model_access: _containers.RepeatedCompositeFieldContainer[ModelAccess]
    network: Network
    policy: SandboxPolicy
    budget: Budget
    placement: Placement
    def __init__(self, id: _Optional[str] = ..., provider: _Optional[_Union[ProviderSpec, _Mapping]] = ..., workspace: _Optional[_Union[WorkspaceDefinition, _Mapping]] = ..., lifecycle: _Optional[_Union[Lifecycle, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., secret_names: _Optional[_Iterable[str]] = ..., max_journal_bytes: _Optional[int] = ..., model_access: _Optional[_Iterable[_Union[ModelAccess, _Mapping]]] = ..., network: _Optional[_Union[Network, _Mapping]] = ..., policy: _Optional[_Union[SandboxPolicy, _Mapping]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("require",)
    REQUIRE_FIELD_NUMBER: _ClassVar[int]
    require: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, require: _Optional[_Iterable[str]] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("max_tokens", "max_input_tokens", "max_output_tokens")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    max_input_tokens: int
    max_output_tokens: int
    def __init__(self, max_tokens: _Optional[int] = ..., max_input_tokens: _Optional[int] = ..., max_output_tokens: _Optional[int] = ...) -> None: ...

class SandboxPolicy(_message.Message):
    __slots__ = ("default", "rules", "request_timeout_ms")
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    default: PolicyEffect
    rules: _containers.RepeatedCompositeFieldContainer[PolicyRule]
    request_timeout_ms: int
    def __init__(self, default: _Optional[_Union[PolicyEffect, str]] = ..., rules: _Optional[_Iterable[_Union[PolicyRule, _Mapping]]] = ..., request_timeout_ms: _Optional[int] = ...) -> None: ...

class PolicyRule(_message.Message):
    __slots__ = ("action", "pattern", "effect")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    action: PolicyAction
    pattern: str
    effect: PolicyEffect
    def __init__(self, action: _Optional[_Union[PolicyAction, str]] = ..., pattern: _Optional[str] = ..., effect: _Optional[_Union[PolicyEffect, str]] = ...) -> None: ...

class ModelAccess(_message.Message):
    __slots__ = ("harness", "upstream", "key_secret")
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    KEY_SECRET_FIELD_NUMBER: _ClassVar[int]
    harness: str
    upstream: str
    key_secret: str
    def __init__(self, harness: _Optional[str] = ..., upstream: _Optional[str] = ..., key_secret: _Optional[str] = ...) -> None: ...

class Network(_message.Message):
    __slots__ = ("allow_hosts", "model_unreachable_ms", "extra_roots_pem", "credentials", "allow", "ask", "deny")
    ALLOW_HOSTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_UNREACHABLE_MS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_ROOTS_PEM_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    ASK_FIELD_NUMBER: _ClassVar[int]
    DENY_FIELD_NUMBER: _ClassVar[int]
    allow_hosts: _containers.RepeatedScalarFieldContainer[str]
    model_unreachable_ms: int
    extra_roots_pem: str
    credentials: _containers.RepeatedCompositeFieldContainer[NetworkCredential]
    allow: _containers.RepeatedCompositeFieldContainer[NetworkRule]
    ask: _containers.RepeatedCompositeFieldContainer[NetworkRule]
    deny: _containers.RepeatedCompositeFieldContainer[NetworkRule]
    def __init__(self, allow_hosts: _Optional[_Iterable[str]] = ..., model_unreachable_ms: _Optional[int] = ..., extra_roots_pem: _Optional[str] = ..., credentials: _Optional[_Iterable[_Union[NetworkCredential, _Mapping]]] = ..., allow: _Optional[_Iterable[_Union[NetworkRule, _Mapping]]] = ..., ask: _Optional[_Iterable[_Union[NetworkRule, _Mapping]]] = ..., deny: _Optional[_Iterable[_Union[NetworkRule, _Mapping]]] = ...) -> None: ...

class NetworkRule(_message.Message):
    __slots__ = ("host", "methods", "path")
    HOST_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    host: str
    methods: _containers.RepeatedScalarFieldContainer[str]
    path: str
    def __init__(self, host: _Optional[str] = ..., methods: _Optional[_Iterable[str]] = ..., path: _Optional[str] = ...) -> None: ...

class NetworkCredential(_message.Message):
    __slots__ = ("secret", "hosts", "header", "format", "basic", "username")
    SECRET_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    BASIC_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    secret: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    header: str
    format: str
    basic: bool
    username: str
    def __init__(self, secret: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., header: _Optional[str] = ..., format: _Optional[str] = ..., basic: _Optional[bool] = ..., username: _Optional[str] = ...) -> None: ...

class ProviderSpec(_message.Message):
    __slots__ = ("local", "docker")
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    DOCKER_FIELD_NUMBER: _ClassVar[int]
    local: LocalProvider
    docker: DockerProvider
    def __init__(self, local: _Optional[_Union[LocalProvider, _Mapping]] = ..., docker: _Optional[_Union[DockerProvider, _Mapping]] = ...) -> None: ...

class LocalProvider(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DockerProvider(_message.Message):
    __slots__ = ("image", "user", "workdir", "memory_bytes", "cpus", "pids_limit", "read_only_root", "mounts", "network", "runtime")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    PIDS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_ROOT_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    image: str
    user: str
    workdir: str
    memory_bytes: int
    cpus: float
    pids_limit: int
    read_only_root: bool
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    network: str
    runtime: str
    def __init__(self, image: _Optional[str] = ..., user: _Optional[str] = ..., workdir: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cpus: _Optional[float] = ..., pids_limit: _Optional[int] = ..., read_only_root: _Optional[bool] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., network: _Optional[str] = ..., runtime: _Optional[str] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("source", "target", "read_only")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    source: str
    target: str
    read_only: bool
    def __init__(self, source: _Optional[str] = ..., target: _Optional[str] = ..., read_only: _Optional[bool] = ...) -> None: ...

class WorkspaceDefinition(_message.Message):
    __slots__ = ("source", "setup", "setup_step_timeout_ms", "scripts", "instructions", "skills", "package_manager")
    class ScriptsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SETUP_FIELD_NUMBER: _ClassVar[int]
    SETUP_STEP_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SCRIPTS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_MANAGER_FIELD_NUMBER: _ClassVar[int]
    source: Source
    setup: _containers.RepeatedCompositeFieldContainer[SetupStep]
    setup_step_timeout_ms: int
    scripts: _containers.ScalarMap[str, str]
    instructions: str
    skills: _containers.RepeatedCompositeFieldContainer[Skill]
    package_manager: str
    def __init__(self, source: _Optional[_Union[Source, _Mapping]] = ..., setup: _Optional[_Iterable[_Union[SetupStep, _Mapping]]] = ..., setup_step_timeout_ms: _Optional[int] = ..., scripts: _Optional[_Mapping[str, str]] = ..., instructions: _Optional[str] = ..., skills: _Optional[_Iterable[_Union[Skill, _Mapping]]] = ..., package_manager: _Optional[str] = ...) -> None: ...

class Source(_message.Message):
    __slots__ = ("git", "none")
    GIT_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    git: GitSource
    none: NoSource
    def __init__(self, git: _Optional[_Union[GitSource, _Mapping]] = ..., none: _Optional[_Union[NoSource, _Mapping]] = ...) -> None: ...

class NoSource(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GitSource(_message.Message):
    __slots__ = ("url", "ref", "depth", "full", "auth_secret")
    URL_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    AUTH_SECRET_FIELD_NUMBER: _ClassVar[int]
    url: str
    ref: str
    depth: int
    full: bool
    auth_secret: str
    def __init__(self, url: _Optional[str] = ..., ref: _Optional[str] = ..., depth: _Optional[int] = ..., full: _Optional[bool] = ..., auth_secret: _Optional[str] = ...) -> None: ...

class SetupStep(_message.Message):
    __slots__ = ("serial", "parallel")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    serial: str
    parallel: ParallelGroup
    def __init__(self, serial: _Optional[str] = ..., parallel: _Optional[_Union[ParallelGroup, _Mapping]] = ...) -> None: ...

class ParallelGroup(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, commands: _Optional[_Iterable[str]] = ...) -> None: ...

class Skill(_message.Message):
    __slots__ = ("file", "git", "mcp", "named")
    FILE_FIELD_NUMBER: _ClassVar[int]
    GIT_FIELD_NUMBER: _ClassVar[int]
    MCP_FIELD_NUMBER: _ClassVar[int]
    NAMED_FIELD_NUMBER: _ClassVar[int]
    file: FileSkill
    git: GitSkill
    mcp: McpSkill
    named: str
    def __init__(self, file: _Optional[_Union[FileSkill, _Mapping]] = ..., git: _Optional[_Union[GitSkill, _Mapping]] = ..., mcp: _Optional[_Union[McpSkill, _Mapping]] = ..., named: _Optional[str] = ...) -> None: ...

class FileSkill(_message.Message):
    __slots__ = ("path", "content")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: str
    def __init__(self, path: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GitSkill(_message.Message):
    __slots__ = ("name", "url", "ref", "into", "auth_secret")
    NAME_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    INTO_FIELD_NUMBER: _ClassVar[int]
    AUTH_SECRET_FIELD_NUMBER: _ClassVar[int]
    name: str
    url: str
    ref: str
    into: str
    auth_secret: str
    def __init__(self, name: _Optional[str] = ..., url: _Optional[str] = ..., ref: _Optional[str] = ..., into: _Optional[str] = ..., auth_secret: _Optional[str] = ...) -> None: ...

class McpSkill(_message.Message):
    __slots__ = ("name", "url", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: HeaderValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[HeaderValue, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    url: str
    headers: _containers.MessageMap[str, HeaderValue]
    def __init__(self, name: _Optional[str] = ..., url: _Optional[str] = ..., headers: _Optional[_Mapping[str, HeaderValue]] = ...) -> None: ...

class HeaderValue(_message.Message):
    __slots__ = ("literal", "secret", "bearer_secret")
    LITERAL_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    BEARER_SECRET_FIELD_NUMBER: _ClassVar[int]
    literal: str
    secret: str
    bearer_secret: str
    def __init__(self, literal: _Optional[str] = ..., secret: _Optional[str] = ..., bearer_secret: _Optional[str] = ...) -> None: ...

class Lifecycle(_message.Message):
    __slots__ = ("reuse", "snapshot", "snapshot_max_age_ms", "keep_alive_ms", "destroy_on_complete", "portable_snapshots", "warm")
    REUSE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    DESTROY_ON_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    PORTABLE_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    reuse: Reuse
    snapshot: SnapshotPolicy
    snapshot_max_age_ms: int
    keep_alive_ms: int
    destroy_on_complete: bool
    portable_snapshots: PortableSnapshots
    warm: int
    def __init__(self, reuse: _Optional[_Union[Reuse, str]] = ..., snapshot: _Optional[_Union[SnapshotPolicy, str]] = ..., snapshot_max_age_ms: _Optional[int] = ..., keep_alive_ms: _Optional[int] = ..., destroy_on_complete: _Optional[bool] = ..., portable_snapshots: _Optional[_Union[PortableSnapshots, _Mapping]] = ..., warm: _Optional[int] = ...) -> None: ...

class PortableSnapshots(_message.Message):
    __slots__ = ("enabled", "include", "exclude", "redact", "max_file_bytes", "max_total_bytes")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    REDACT_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    include: _containers.RepeatedScalarFieldContainer[str]
    exclude: _containers.RepeatedScalarFieldContainer[str]
    redact: _containers.RepeatedScalarFieldContainer[str]
    max_file_bytes: int
    max_total_bytes: int
    def __init__(self, enabled: _Optional[bool] = ..., include: _Optional[_Iterable[str]] = ..., exclude: _Optional[_Iterable[str]] = ..., redact: _Optional[_Iterable[str]] = ..., max_file_bytes: _Optional[int] = ..., max_total_bytes: _Optional[int] = ...) -> None: ...

class PutDefinitionRequest(_message.Message):
    __slots__ = ("definition",)
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    definition: SandboxDefinition
    def __init__(self, definition: _Optional[_Union[SandboxDefinition, _Mapping]] = ...) -> None: ...

class PutDefinitionResponse(_message.Message):
    __slots__ = ("definition",)
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    definition: SandboxDefinition
    def __init__(self, definition: _Optional[_Union[SandboxDefinition, _Mapping]] = ...) -> None: ...

class GetDefinitionRequest(_message.Message):
    __slots__ = ("id", "thread_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    thread_id: str
    def __init__(self, id: _Optional[str] = ..., thread_id: _Optional[str] = ...) -> None: ...

class GetDefinitionResponse(_message.Message):
    __slots__ = ("definition",)
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    definition: SandboxDefinition
    def __init__(self, definition: _Optional[_Union[SandboxDefinition, _Mapping]] = ...) -> None: ...

class ListDefinitionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDefinitionsResponse(_message.Message):
    __slots__ = ("definitions",)
    DEFINITIONS_FIELD_NUMBER: _ClassVar[int]
    definitions: _containers.RepeatedCompositeFieldContainer[SandboxDefinition]
    def __init__(self, definitions: _Optional[_Iterable[_Union[SandboxDefinition, _Mapping]]] = ...) -> None: ...

class DeleteDefinitionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteDefinitionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnsureSandboxRequest(_message.Message):
    __slots__ = ("definition_id", "thread_id", "secrets", "run_id")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    definition_id: str
    thread_id: str
    secrets: _containers.ScalarMap[str, str]
    run_id: str
    def __init__(self, definition_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., secrets: _Optional[_Mapping[str, str]] = ..., run_id: _Optional[str] = ...) -> None: ...

class EnsureSandboxResponse(_message.Message):
    __slots__ = ("progress", "ready")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    progress: EnsureProgress
    ready: EnsureReady
    def __init__(self, progress: _Optional[_Union[EnsureProgress, _Mapping]] = ..., ready: _Optional[_Union[EnsureReady, _Mapping]] = ...) -> None: ...

class EnsureProgress(_message.Message):
    __slots__ = ("phase", "message", "step", "steps", "command", "output_line", "elapsed_ms", "network", "warning", "output_stream")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LINE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_STREAM_FIELD_NUMBER: _ClassVar[int]
    phase: EnsurePhase
    message: str
    step: int
    steps: int
    command: str
    output_line: str
    elapsed_ms: int
    network: str
    warning: str
    output_stream: OutputStream
    def __init__(self, phase: _Optional[_Union[EnsurePhase, str]] = ..., message: _Optional[str] = ..., step: _Optional[int] = ..., steps: _Optional[int] = ..., command: _Optional[str] = ..., output_line: _Optional[str] = ..., elapsed_ms: _Optional[int] = ..., network: _Optional[str] = ..., warning: _Optional[str] = ..., output_stream: _Optional[_Union[OutputStream, str]] = ...) -> None: ...

class EnsureReady(_message.Message):
    __slots__ = ("sandbox_id", "outcome", "sandbox", "restored_checkpoint_id")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    RESTORED_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    outcome: EnsureOutcome
    sandbox: Sandbox
    restored_checkpoint_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., outcome: _Optional[_Union[EnsureOutcome, str]] = ..., sandbox: _Optional[_Union[Sandbox, _Mapping]] = ..., restored_checkpoint_id: _Optional[str] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("snapshots", "fork", "background_processes", "killable_processes", "writable_stdin", "durable_filesystem", "network_policy", "ports", "terminal", "landlock", "seccomp", "runtime")
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    KILLABLE_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_STDIN_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FILESYSTEM_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    LANDLOCK_FIELD_NUMBER: _ClassVar[int]
    SECCOMP_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    snapshots: bool
    fork: bool
    background_processes: bool
    killable_processes: bool
    writable_stdin: bool
    durable_filesystem: bool
    network_policy: bool
    ports: bool
    terminal: bool
    landlock: bool
    seccomp: bool
    runtime: str
    def __init__(self, snapshots: _Optional[bool] = ..., fork: _Optional[bool] = ..., background_processes: _Optional[bool] = ..., killable_processes: _Optional[bool] = ..., writable_stdin: _Optional[bool] = ..., durable_filesystem: _Optional[bool] = ..., network_policy: _Optional[bool] = ..., ports: _Optional[bool] = ..., terminal: _Optional[bool] = ..., landlock: _Optional[bool] = ..., seccomp: _Optional[bool] = ..., runtime: _Optional[str] = ...) -> None: ...

class Sandbox(_message.Message):
    __slots__ = ("sandbox_id", "definition_id", "thread_id", "provider", "provider_sandbox_id", "created_at_ms", "updated_at_ms", "capabilities", "env", "secret_names", "state", "keep_alive_ms", "usage", "node")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SECRET_NAMES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    definition_id: str
    thread_id: str
    provider: str
    provider_sandbox_id: str
    created_at_ms: int
    updated_at_ms: int
    capabilities: Capabilities
    env: _containers.ScalarMap[str, str]
    secret_names: _containers.RepeatedScalarFieldContainer[str]
    state: SandboxState
    keep_alive_ms: int
    usage: ResourceUsage
    node: str
    def __init__(self, sandbox_id: _Optional[str] = ..., definition_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., provider: _Optional[str] = ..., provider_sandbox_id: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., secret_names: _Optional[_Iterable[str]] = ..., state: _Optional[_Union[SandboxState, str]] = ..., keep_alive_ms: _Optional[int] = ..., usage: _Optional[_Union[ResourceUsage, _Mapping]] = ..., node: _Optional[str] = ...) -> None: ...

class ResourceUsage(_message.Message):
    __slots__ = ("cpu_time_ms", "memory_bytes", "memory_limit_bytes", "measured_at_ms")
    CPU_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    cpu_time_ms: int
    memory_bytes: int
    memory_limit_bytes: int
    measured_at_ms: int
    def __init__(self, cpu_time_ms: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., measured_at_ms: _Optional[int] = ...) -> None: ...

class SetEnvRequest(_message.Message):
    __slots__ = ("sandbox_id", "set", "unset")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    UNSET_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    set: _containers.ScalarMap[str, str]
    unset: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sandbox_id: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., unset: _Optional[_Iterable[str]] = ...) -> None: ...

class SetEnvResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class UpdateNetworkPolicyRequest(_message.Message):
    __slots__ = ("sandbox_id", "allow_hosts", "deny_hosts", "reset")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOW_HOSTS_FIELD_NUMBER: _ClassVar[int]
    DENY_HOSTS_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    allow_hosts: _containers.RepeatedScalarFieldContainer[str]
    deny_hosts: _containers.RepeatedScalarFieldContainer[str]
    reset: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., allow_hosts: _Optional[_Iterable[str]] = ..., deny_hosts: _Optional[_Iterable[str]] = ..., reset: _Optional[bool] = ...) -> None: ...

class UpdateNetworkPolicyResponse(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: LiveNetworkPolicy
    def __init__(self, policy: _Optional[_Union[LiveNetworkPolicy, _Mapping]] = ...) -> None: ...

class LiveNetworkPolicy(_message.Message):
    __slots__ = ("allow_hosts", "deny_hosts", "version", "changed_by", "changed_at_ms", "definition_allow", "definition_ask", "definition_deny")
    ALLOW_HOSTS_FIELD_NUMBER: _ClassVar[int]
    DENY_HOSTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_BY_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ALLOW_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_ASK_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_DENY_FIELD_NUMBER: _ClassVar[int]
    allow_hosts: _containers.RepeatedScalarFieldContainer[str]
    deny_hosts: _containers.RepeatedScalarFieldContainer[str]
    version: int
    changed_by: str
    changed_at_ms: int
    definition_allow: _containers.RepeatedScalarFieldContainer[str]
    definition_ask: _containers.RepeatedScalarFieldContainer[str]
    definition_deny: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allow_hosts: _Optional[_Iterable[str]] = ..., deny_hosts: _Optional[_Iterable[str]] = ..., version: _Optional[int] = ..., changed_by: _Optional[str] = ..., changed_at_ms: _Optional[int] = ..., definition_allow: _Optional[_Iterable[str]] = ..., definition_ask: _Optional[_Iterable[str]] = ..., definition_deny: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class GetSandboxResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class ListSandboxesRequest(_message.Message):
    __slots__ = ("thread_id", "with_state")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_STATE_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    with_state: bool
    def __init__(self, thread_id: _Optional[str] = ..., with_state: _Optional[bool] = ...) -> None: ...

class ListSandboxesResponse(_message.Message):
    __slots__ = ("sandboxes",)
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[Sandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[Sandbox, _Mapping]]] = ...) -> None: ...

class DestroySandboxRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class DestroySandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWarmPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WarmPool(_message.Message):
    __slots__ = ("definition_id", "tenant", "target", "ready", "claimed", "refilling", "last_error")
    DEFINITION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    REFILLING_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    definition_id: str
    tenant: str
    target: int
    ready: int
    claimed: int
    refilling: int
    last_error: str
    def __init__(self, definition_id: _Optional[str] = ..., tenant: _Optional[str] = ..., target: _Optional[int] = ..., ready: _Optional[int] = ..., claimed: _Optional[int] = ..., refilling: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListWarmPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[WarmPool]
    def __init__(self, pools: _Optional[_Iterable[_Union[WarmPool, _Mapping]]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("argv", "shell")
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    argv: Argv
    shell: str
    def __init__(self, argv: _Optional[_Union[Argv, _Mapping]] = ..., shell: _Optional[str] = ...) -> None: ...

class Argv(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class ExitStatus(_message.Message):
    __slots__ = ("code", "signal")
    CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    code: int
    signal: int
    def __init__(self, code: _Optional[int] = ..., signal: _Optional[int] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("sandbox_id", "command", "cwd", "env", "secrets", "stdin", "timeout_ms", "output_limit_bytes")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    command: Command
    cwd: str
    env: _containers.ScalarMap[str, str]
    secrets: _containers.ScalarMap[str, str]
    stdin: bytes
    timeout_ms: int
    output_limit_bytes: int
    def __init__(self, sandbox_id: _Optional[str] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., secrets: _Optional[_Mapping[str, str]] = ..., stdin: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., output_limit_bytes: _Optional[int] = ...) -> None: ...

class ExecResponse(_message.Message):
    __slots__ = ("status", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "timed_out", "duration_ms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    status: ExitStatus
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_ms: int
    def __init__(self, status: _Optional[_Union[ExitStatus, _Mapping]] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., stdout_truncated: _Optional[bool] = ..., stderr_truncated: _Optional[bool] = ..., timed_out: _Optional[bool] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class ExecStreamRequest(_message.Message):
    __slots__ = ("start", "stdin", "close_stdin", "signal")
    START_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    CLOSE_STDIN_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    start: ExecStreamStart
    stdin: bytes
    close_stdin: CloseStdin
    signal: int
    def __init__(self, start: _Optional[_Union[ExecStreamStart, _Mapping]] = ..., stdin: _Optional[bytes] = ..., close_stdin: _Optional[_Union[CloseStdin, _Mapping]] = ..., signal: _Optional[int] = ...) -> None: ...

class ExecStreamStart(_message.Message):
    __slots__ = ("sandbox_id", "command", "cwd", "env", "secrets")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    command: Command
    cwd: str
    env: _containers.ScalarMap[str, str]
    secrets: _containers.ScalarMap[str, str]
    def __init__(self, sandbox_id: _Optional[str] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., secrets: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CloseStdin(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecStreamResponse(_message.Message):
    __slots__ = ("started_pid", "output", "exited")
    STARTED_PID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    started_pid: int
    output: OutputChunk
    exited: ExitStatus
    def __init__(self, started_pid: _Optional[int] = ..., output: _Optional[_Union[OutputChunk, _Mapping]] = ..., exited: _Optional[_Union[ExitStatus, _Mapping]] = ...) -> None: ...

class OutputChunk(_message.Message):
    __slots__ = ("stream", "data")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    stream: OutputStream
    data: bytes
    def __init__(self, stream: _Optional[_Union[OutputStream, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("path", "name", "type", "size", "mode", "mtime_ms", "symlink_target")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MTIME_MS_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    path: str
    name: str
    type: FileType
    size: int
    mode: int
    mtime_ms: int
    symlink_target: str
    def __init__(self, path: _Optional[str] = ..., name: _Optional[str] = ..., type: _Optional[_Union[FileType, str]] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., mtime_ms: _Optional[int] = ..., symlink_target: _Optional[str] = ...) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "offset", "limit")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    offset: int
    limit: int
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ReadFileResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class WriteFileRequest(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: WriteFileHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[WriteFileHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class WriteFileHeader(_message.Message):
    __slots__ = ("sandbox_id", "path", "mode", "make_parents", "size")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAKE_PARENTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    mode: int
    make_parents: bool
    size: int
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., make_parents: _Optional[bool] = ..., size: _Optional[int] = ...) -> None: ...

class WriteFileResponse(_message.Message):
    __slots__ = ("bytes_written",)
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    def __init__(self, bytes_written: _Optional[int] = ...) -> None: ...

class ListFilesRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "depth")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    depth: int
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., depth: _Optional[int] = ...) -> None: ...

class ListFilesResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ...) -> None: ...

class StatFileRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "no_follow")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NO_FOLLOW_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    no_follow: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., no_follow: _Optional[bool] = ...) -> None: ...

class StatFileResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ...) -> None: ...

class MakeDirRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "parents")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    parents: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., parents: _Optional[bool] = ...) -> None: ...

class MakeDirResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemoveFileRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "recursive")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    recursive: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class RemoveFileResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RenameFileRequest(_message.Message):
    __slots__ = ("sandbox_id", "to")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    to: str
    def __init__(self, sandbox_id: _Optional[str] = ..., to: _Optional[str] = ..., **kwargs) -> None: ...

class RenameFileResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchFilesRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "recursive", "ignore")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    IGNORE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    recursive: bool
    ignore: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ..., ignore: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchFilesResponse(_message.Message):
    __slots__ = ("started", "event")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    started: WatchStarted
    event: FileEvent
    def __init__(self, started: _Optional[_Union[WatchStarted, _Mapping]] = ..., event: _Optional[_Union[FileEvent, _Mapping]] = ...) -> None: ...

class WatchStarted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FileEvent(_message.Message):
    __slots__ = ("type", "path", "timestamp_ms", "from_path", "is_dir")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    FROM_PATH_FIELD_NUMBER: _ClassVar[int]
    IS_DIR_FIELD_NUMBER: _ClassVar[int]
    type: FileEventType
    path: str
    timestamp_ms: int
    from_path: str
    is_dir: bool
    def __init__(self, type: _Optional[_Union[FileEventType, str]] = ..., path: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., from_path: _Optional[str] = ..., is_dir: _Optional[bool] = ...) -> None: ...

class ConnectPortRequest(_message.Message):
    __slots__ = ("open", "data", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: ConnectPortOpen
    data: bytes
    close: ConnectPortClose
    def __init__(self, open: _Optional[_Union[ConnectPortOpen, _Mapping]] = ..., data: _Optional[bytes] = ..., close: _Optional[_Union[ConnectPortClose, _Mapping]] = ...) -> None: ...

class ConnectPortOpen(_message.Message):
    __slots__ = ("sandbox_id", "port")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    port: int
    def __init__(self, sandbox_id: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class ConnectPortClose(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConnectPortResponse(_message.Message):
    __slots__ = ("opened", "data")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    opened: ConnectPortOpened
    data: bytes
    def __init__(self, opened: _Optional[_Union[ConnectPortOpened, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ConnectPortOpened(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenTerminalRequest(_message.Message):
    __slots__ = ("start", "input", "resize", "signal")
    START_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    RESIZE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    start: OpenTerminalStart
    input: bytes
    resize: TerminalSize
    signal: int
    def __init__(self, start: _Optional[_Union[OpenTerminalStart, _Mapping]] = ..., input: _Optional[bytes] = ..., resize: _Optional[_Union[TerminalSize, _Mapping]] = ..., signal: _Optional[int] = ...) -> None: ...

class OpenTerminalStart(_message.Message):
    __slots__ = ("sandbox_id", "command", "cwd", "env", "secrets", "size", "term")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    command: Command
    cwd: str
    env: _containers.ScalarMap[str, str]
    secrets: _containers.ScalarMap[str, str]
    size: TerminalSize
    term: str
    def __init__(self, sandbox_id: _Optional[str] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., secrets: _Optional[_Mapping[str, str]] = ..., size: _Optional[_Union[TerminalSize, _Mapping]] = ..., term: _Optional[str] = ...) -> None: ...

class TerminalSize(_message.Message):
    __slots__ = ("rows", "cols")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class OpenTerminalResponse(_message.Message):
    __slots__ = ("started_pid", "output", "exited")
    STARTED_PID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    started_pid: int
    output: bytes
    exited: ExitStatus
    def __init__(self, started_pid: _Optional[int] = ..., output: _Optional[bytes] = ..., exited: _Optional[_Union[ExitStatus, _Mapping]] = ...) -> None: ...

class GitFileStatus(_message.Message):
    __slots__ = ("path", "original_path", "staged", "unstaged")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_PATH_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    UNSTAGED_FIELD_NUMBER: _ClassVar[int]
    path: str
    original_path: str
    staged: GitChange
    unstaged: GitChange
    def __init__(self, path: _Optional[str] = ..., original_path: _Optional[str] = ..., staged: _Optional[_Union[GitChange, str]] = ..., unstaged: _Optional[_Union[GitChange, str]] = ...) -> None: ...

class GitStatusRequest(_message.Message):
    __slots__ = ("sandbox_id", "path")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class GitStatusResponse(_message.Message):
    __slots__ = ("branch", "head", "upstream", "ahead", "behind", "files")
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    branch: str
    head: str
    upstream: str
    ahead: int
    behind: int
    files: _containers.RepeatedCompositeFieldContainer[GitFileStatus]
    def __init__(self, branch: _Optional[str] = ..., head: _Optional[str] = ..., upstream: _Optional[str] = ..., ahead: _Optional[int] = ..., behind: _Optional[int] = ..., files: _Optional[_Iterable[_Union[GitFileStatus, _Mapping]]] = ...) -> None: ...

class GitDiffRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "base", "staged", "paths")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    base: str
    staged: bool
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., base: _Optional[str] = ..., staged: _Optional[bool] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class GitDiffFile(_message.Message):
    __slots__ = ("path", "added", "deleted", "binary")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    path: str
    added: int
    deleted: int
    binary: bool
    def __init__(self, path: _Optional[str] = ..., added: _Optional[int] = ..., deleted: _Optional[int] = ..., binary: _Optional[bool] = ...) -> None: ...

class GitDiffResponse(_message.Message):
    __slots__ = ("diff", "files", "truncated")
    DIFF_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    diff: str
    files: _containers.RepeatedCompositeFieldContainer[GitDiffFile]
    truncated: bool
    def __init__(self, diff: _Optional[str] = ..., files: _Optional[_Iterable[_Union[GitDiffFile, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class GitAddRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "paths")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class GitAddResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: GitStatusResponse
    def __init__(self, status: _Optional[_Union[GitStatusResponse, _Mapping]] = ...) -> None: ...

class GitAuthor(_message.Message):
    __slots__ = ("name", "email")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EMAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    email: str
    def __init__(self, name: _Optional[str] = ..., email: _Optional[str] = ...) -> None: ...

class GitCommitRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "message", "author", "all", "allow_empty")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    ALLOW_EMPTY_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    message: str
    author: GitAuthor
    all: bool
    allow_empty: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., message: _Optional[str] = ..., author: _Optional[_Union[GitAuthor, _Mapping]] = ..., all: _Optional[bool] = ..., allow_empty: _Optional[bool] = ...) -> None: ...

class GitCommitResponse(_message.Message):
    __slots__ = ("commit", "branch")
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    commit: str
    branch: str
    def __init__(self, commit: _Optional[str] = ..., branch: _Optional[str] = ...) -> None: ...

class GitBranchRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "name", "create", "start_point")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    START_POINT_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    name: str
    create: bool
    start_point: str
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., name: _Optional[str] = ..., create: _Optional[bool] = ..., start_point: _Optional[str] = ...) -> None: ...

class GitBranchResponse(_message.Message):
    __slots__ = ("branch", "head")
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    branch: str
    head: str
    def __init__(self, branch: _Optional[str] = ..., head: _Optional[str] = ...) -> None: ...

class GitPushRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "remote", "branch", "force", "secrets")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    remote: str
    branch: str
    force: bool
    secrets: _containers.ScalarMap[str, str]
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., remote: _Optional[str] = ..., branch: _Optional[str] = ..., force: _Optional[bool] = ..., secrets: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GitPushResponse(_message.Message):
    __slots__ = ("remote", "branch", "commit")
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    remote: str
    branch: str
    commit: str
    def __init__(self, remote: _Optional[str] = ..., branch: _Optional[str] = ..., commit: _Optional[str] = ...) -> None: ...

class GitPullRequest(_message.Message):
    __slots__ = ("sandbox_id", "path", "remote", "branch", "secrets")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    remote: str
    branch: str
    secrets: _containers.ScalarMap[str, str]
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., remote: _Optional[str] = ..., branch: _Optional[str] = ..., secrets: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GitPullResponse(_message.Message):
    __slots__ = ("before", "after")
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    before: str
    after: str
    def __init__(self, before: _Optional[str] = ..., after: _Optional[str] = ...) -> None: ...
