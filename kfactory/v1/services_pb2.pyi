from kfactory.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CampaignStatus(_message.Message):
    __slots__ = ("id", "spec", "state", "counts", "best_candidate_id", "best_score_s", "elapsed_s", "summary_json", "device", "reason", "after_finish")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    BEST_CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    BEST_SCORE_S_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AFTER_FINISH_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: _events_pb2.CampaignSpec
    state: str
    counts: _events_pb2.Counts
    best_candidate_id: str
    best_score_s: float
    elapsed_s: float
    summary_json: str
    device: _events_pb2.DeviceInfo
    reason: str
    after_finish: _events_pb2.Counts
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[_events_pb2.CampaignSpec, _Mapping]] = ..., state: _Optional[str] = ..., counts: _Optional[_Union[_events_pb2.Counts, _Mapping]] = ..., best_candidate_id: _Optional[str] = ..., best_score_s: _Optional[float] = ..., elapsed_s: _Optional[float] = ..., summary_json: _Optional[str] = ..., device: _Optional[_Union[_events_pb2.DeviceInfo, _Mapping]] = ..., reason: _Optional[str] = ..., after_finish: _Optional[_Union[_events_pb2.Counts, _Mapping]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _events_pb2.CampaignSpec
    def __init__(self, spec: _Optional[_Union[_events_pb2.CampaignSpec, _Mapping]] = ...) -> None: ...

class GetCampaignRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListCampaignsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListCampaignsResponse(_message.Message):
    __slots__ = ("campaigns", "next_page_token")
    CAMPAIGNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    campaigns: _containers.RepeatedCompositeFieldContainer[CampaignStatus]
    next_page_token: str
    def __init__(self, campaigns: _Optional[_Iterable[_Union[CampaignStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class LeaderboardEntry(_message.Message):
    __slots__ = ("candidate_id", "campaign_id", "problem", "family", "params_json", "origin", "score_s", "timings", "device", "checks", "after_finish", "result", "found_wrong", "screened_out", "objective")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SCORE_S_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    AFTER_FINISH_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    FOUND_WRONG_FIELD_NUMBER: _ClassVar[int]
    SCREENED_OUT_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    campaign_id: str
    problem: str
    family: str
    params_json: str
    origin: str
    score_s: float
    timings: _containers.RepeatedCompositeFieldContainer[_events_pb2.ShapeTiming]
    device: str
    checks: _containers.RepeatedCompositeFieldContainer[_events_pb2.Check]
    after_finish: bool
    result: bool
    found_wrong: bool
    screened_out: bool
    objective: str
    def __init__(self, candidate_id: _Optional[str] = ..., campaign_id: _Optional[str] = ..., problem: _Optional[str] = ..., family: _Optional[str] = ..., params_json: _Optional[str] = ..., origin: _Optional[str] = ..., score_s: _Optional[float] = ..., timings: _Optional[_Iterable[_Union[_events_pb2.ShapeTiming, _Mapping]]] = ..., device: _Optional[str] = ..., checks: _Optional[_Iterable[_Union[_events_pb2.Check, _Mapping]]] = ..., after_finish: _Optional[bool] = ..., result: _Optional[bool] = ..., found_wrong: _Optional[bool] = ..., screened_out: _Optional[bool] = ..., objective: _Optional[str] = ...) -> None: ...

class BestRequest(_message.Message):
    __slots__ = ("problem", "shape", "device", "target", "require_known")
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_KNOWN_FIELD_NUMBER: _ClassVar[int]
    problem: str
    shape: str
    device: str
    target: str
    require_known: bool
    def __init__(self, problem: _Optional[str] = ..., shape: _Optional[str] = ..., device: _Optional[str] = ..., target: _Optional[str] = ..., require_known: _Optional[bool] = ...) -> None: ...

class LeaderboardRequest(_message.Message):
    __slots__ = ("campaign_id", "limit")
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    campaign_id: str
    limit: int
    def __init__(self, campaign_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class LeaderboardResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LeaderboardEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[LeaderboardEntry, _Mapping]]] = ...) -> None: ...

class CandidateRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RegressionRequest(_message.Message):
    __slots__ = ("problem",)
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    problem: str
    def __init__(self, problem: _Optional[str] = ...) -> None: ...

class KnownWrongRequest(_message.Message):
    __slots__ = ("problem",)
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    problem: str
    def __init__(self, problem: _Optional[str] = ...) -> None: ...

class KnownWrongResponse(_message.Message):
    __slots__ = ("kernels",)
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    kernels: _containers.RepeatedCompositeFieldContainer[_events_pb2.KnownWrong]
    def __init__(self, kernels: _Optional[_Iterable[_Union[_events_pb2.KnownWrong, _Mapping]]] = ...) -> None: ...

class ComparisonCostRequest(_message.Message):
    __slots__ = ("problem", "target", "device")
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    problem: str
    target: str
    device: str
    def __init__(self, problem: _Optional[str] = ..., target: _Optional[str] = ..., device: _Optional[str] = ...) -> None: ...

class ComparisonCostResponse(_message.Message):
    __slots__ = ("campaigns",)
    CAMPAIGNS_FIELD_NUMBER: _ClassVar[int]
    campaigns: _containers.RepeatedCompositeFieldContainer[ComparisonCost]
    def __init__(self, campaigns: _Optional[_Iterable[_Union[ComparisonCost, _Mapping]]] = ...) -> None: ...

class ComparisonCost(_message.Message):
    __slots__ = ("campaign_id", "showdown_s", "final_s")
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    SHOWDOWN_S_FIELD_NUMBER: _ClassVar[int]
    FINAL_S_FIELD_NUMBER: _ClassVar[int]
    campaign_id: str
    showdown_s: float
    final_s: float
    def __init__(self, campaign_id: _Optional[str] = ..., showdown_s: _Optional[float] = ..., final_s: _Optional[float] = ...) -> None: ...

class PriorsRequest(_message.Message):
    __slots__ = ("problem", "families", "exclude_campaign", "limit", "every_source", "require_known")
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    FAMILIES_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    EVERY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_KNOWN_FIELD_NUMBER: _ClassVar[int]
    problem: str
    families: _containers.RepeatedScalarFieldContainer[str]
    exclude_campaign: str
    limit: int
    every_source: bool
    require_known: bool
    def __init__(self, problem: _Optional[str] = ..., families: _Optional[_Iterable[str]] = ..., exclude_campaign: _Optional[str] = ..., limit: _Optional[int] = ..., every_source: _Optional[bool] = ..., require_known: _Optional[bool] = ...) -> None: ...

class PriorsResponse(_message.Message):
    __slots__ = ("priors",)
    PRIORS_FIELD_NUMBER: _ClassVar[int]
    priors: _containers.RepeatedCompositeFieldContainer[_events_pb2.Prior]
    def __init__(self, priors: _Optional[_Iterable[_Union[_events_pb2.Prior, _Mapping]]] = ...) -> None: ...

class RegressionResponse(_message.Message):
    __slots__ = ("inputs",)
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[_events_pb2.RegressionInput]
    def __init__(self, inputs: _Optional[_Iterable[_Union[_events_pb2.RegressionInput, _Mapping]]] = ...) -> None: ...

class CandidateEvidence(_message.Message):
    __slots__ = ("candidate", "events", "lineage", "source")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    candidate: _events_pb2.Candidate
    events: _containers.RepeatedCompositeFieldContainer[_events_pb2.Event]
    lineage: _containers.RepeatedScalarFieldContainer[str]
    source: str
    def __init__(self, candidate: _Optional[_Union[_events_pb2.Candidate, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_events_pb2.Event, _Mapping]]] = ..., lineage: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("campaign_id",)
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    campaign_id: str
    def __init__(self, campaign_id: _Optional[str] = ...) -> None: ...

class LessonsRequest(_message.Message):
    __slots__ = ("problem", "target", "limit", "require_known")
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_KNOWN_FIELD_NUMBER: _ClassVar[int]
    problem: str
    target: str
    limit: int
    require_known: bool
    def __init__(self, problem: _Optional[str] = ..., target: _Optional[str] = ..., limit: _Optional[int] = ..., require_known: _Optional[bool] = ...) -> None: ...

class Lesson(_message.Message):
    __slots__ = ("kind", "text", "value", "count")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    text: str
    value: float
    count: int
    def __init__(self, kind: _Optional[str] = ..., text: _Optional[str] = ..., value: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class LessonsResponse(_message.Message):
    __slots__ = ("lessons", "text")
    LESSONS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    lessons: _containers.RepeatedCompositeFieldContainer[Lesson]
    text: str
    def __init__(self, lessons: _Optional[_Iterable[_Union[Lesson, _Mapping]]] = ..., text: _Optional[str] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("markdown", "plot_png", "campaign_id")
    MARKDOWN_FIELD_NUMBER: _ClassVar[int]
    PLOT_PNG_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    markdown: str
    plot_png: bytes
    campaign_id: str
    def __init__(self, markdown: _Optional[str] = ..., plot_png: _Optional[bytes] = ..., campaign_id: _Optional[str] = ...) -> None: ...

class BundleChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ExportRequest(_message.Message):
    __slots__ = ("problem", "target", "require_known")
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_KNOWN_FIELD_NUMBER: _ClassVar[int]
    problem: str
    target: str
    require_known: bool
    def __init__(self, problem: _Optional[str] = ..., target: _Optional[str] = ..., require_known: _Optional[bool] = ...) -> None: ...

class ImportResult(_message.Message):
    __slots__ = ("events_added", "events_present", "objects_added", "regressions_added", "campaigns", "refused", "events_held")
    EVENTS_ADDED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PRESENT_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_ADDED_FIELD_NUMBER: _ClassVar[int]
    REGRESSIONS_ADDED_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGNS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_HELD_FIELD_NUMBER: _ClassVar[int]
    events_added: int
    events_present: int
    objects_added: int
    regressions_added: int
    campaigns: int
    refused: _containers.RepeatedScalarFieldContainer[str]
    events_held: int
    def __init__(self, events_added: _Optional[int] = ..., events_present: _Optional[int] = ..., objects_added: _Optional[int] = ..., regressions_added: _Optional[int] = ..., campaigns: _Optional[int] = ..., refused: _Optional[_Iterable[str]] = ..., events_held: _Optional[int] = ...) -> None: ...
