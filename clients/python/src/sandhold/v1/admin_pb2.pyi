from sandhold.v1 import node_pb2 as _node_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("server_version", "tenant", "replica_id", "store_backend", "lease_backend")
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    LEASE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    tenant: str
    replica_id: str
    store_backend: str
    lease_backend: str
    def __init__(self, server_version: _Optional[str] = ..., tenant: _Optional[str] = ..., replica_id: _Optional[str] = ..., store_backend: _Optional[str] = ..., lease_backend: _Optional[str] = ...) -> None: ...

class SweepRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SweptRun(_message.Message):
    __slots__ = ("run_id", "outcome", "detail", "terminalized_anyway")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TERMINALIZED_ANYWAY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    outcome: str
    detail: str
    terminalized_anyway: bool
    def __init__(self, run_id: _Optional[str] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ..., terminalized_anyway: _Optional[bool] = ...) -> None: ...

class SweepResponse(_message.Message):
    __slots__ = ("outcomes", "runs", "journals_pruned", "journals_kept", "sandboxes_reclaimed", "truncated", "scope", "elapsed_ms", "runs_removed", "definitions_removed")
    class OutcomesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    JOURNALS_PRUNED_FIELD_NUMBER: _ClassVar[int]
    JOURNALS_KEPT_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    RUNS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    DEFINITIONS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.ScalarMap[str, int]
    runs: _containers.RepeatedCompositeFieldContainer[SweptRun]
    journals_pruned: int
    journals_kept: int
    sandboxes_reclaimed: int
    truncated: bool
    scope: str
    elapsed_ms: int
    runs_removed: int
    definitions_removed: int
    def __init__(self, outcomes: _Optional[_Mapping[str, int]] = ..., runs: _Optional[_Iterable[_Union[SweptRun, _Mapping]]] = ..., journals_pruned: _Optional[int] = ..., journals_kept: _Optional[int] = ..., sandboxes_reclaimed: _Optional[int] = ..., truncated: _Optional[bool] = ..., scope: _Optional[str] = ..., elapsed_ms: _Optional[int] = ..., runs_removed: _Optional[int] = ..., definitions_removed: _Optional[int] = ...) -> None: ...
