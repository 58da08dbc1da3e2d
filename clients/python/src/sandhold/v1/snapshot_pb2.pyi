from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Checkpoint(_message.Message):
    __slots__ = ("checkpoint_id", "thread_id", "parent_id", "run_id", "label", "created_at_ms", "file_count", "dir_count", "total_bytes", "uploaded_bytes", "head", "forked_from")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    DIR_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    thread_id: str
    parent_id: str
    run_id: str
    label: str
    created_at_ms: int
    file_count: int
    dir_count: int
    total_bytes: int
    uploaded_bytes: int
    head: bool
    forked_from: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., parent_id: _Optional[str] = ..., run_id: _Optional[str] = ..., label: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., file_count: _Optional[int] = ..., dir_count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., uploaded_bytes: _Optional[int] = ..., head: _Optional[bool] = ..., forked_from: _Optional[str] = ...) -> None: ...

class SaveSnapshotRequest(_message.Message):
    __slots__ = ("thread_id", "run_id", "label", "sandbox_id")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    run_id: str
    label: str
    sandbox_id: str
    def __init__(self, thread_id: _Optional[str] = ..., run_id: _Optional[str] = ..., label: _Optional[str] = ..., sandbox_id: _Optional[str] = ...) -> None: ...

class SaveSnapshotResponse(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("thread_id",)
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    def __init__(self, thread_id: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ...) -> None: ...

class ForkSnapshotRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id", "new_thread_id")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    new_thread_id: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., new_thread_id: _Optional[str] = ...) -> None: ...

class ForkSnapshotResponse(_message.Message):
    __slots__ = ("checkpoint", "run_ids")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., run_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadArtifactRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id", "path")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    path: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ReadArtifactResponse(_message.Message):
    __slots__ = ("info", "data")
    INFO_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    info: ArtifactInfo
    data: bytes
    def __init__(self, info: _Optional[_Union[ArtifactInfo, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ArtifactInfo(_message.Message):
    __slots__ = ("path", "size", "mode", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    mode: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
