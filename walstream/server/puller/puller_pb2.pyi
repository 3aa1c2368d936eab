from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SubscribeRequest(_message.Message):
    __slots__ = ("consumer_id", "after", "coalesce_on_catch_up", "stream")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    COALESCE_ON_CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    after: str
    coalesce_on_catch_up: bool
    stream: str
    def __init__(self, consumer_id: _Optional[str] = ..., after: _Optional[str] = ..., coalesce_on_catch_up: _Optional[bool] = ..., stream: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("source", "table", "action", "key", "lsn", "seq", "idempotency_key", "progress", "message", "coalesced", "progress_only")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COALESCED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_ONLY_FIELD_NUMBER: _ClassVar[int]
    source: str
    table: str
    action: str
    key: str
    lsn: int
    seq: int
    idempotency_key: str
    progress: str
    message: str
    coalesced: int
    progress_only: bool
    def __init__(self, source: _Optional[str] = ..., table: _Optional[str] = ..., action: _Optional[str] = ..., key: _Optional[str] = ..., lsn: _Optional[int] = ..., seq: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., progress: _Optional[str] = ..., message: _Optional[str] = ..., coalesced: _Optional[int] = ..., progress_only: _Optional[bool] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("stream", "consumer_id", "progress")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    consumer_id: str
    progress: str
    def __init__(self, stream: _Optional[str] = ..., consumer_id: _Optional[str] = ..., progress: _Optional[str] = ...) -> None: ...

class AckReply(_message.Message):
    __slots__ = ("progress",)
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    progress: str
    def __init__(self, progress: _Optional[str] = ...) -> None: ...
