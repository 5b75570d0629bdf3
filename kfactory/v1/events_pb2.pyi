from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RejectReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECT_REASON_UNSPECIFIED: _ClassVar[RejectReason]
    COMPILE_ERROR: _ClassVar[RejectReason]
    RESOURCE_LIMIT: _ClassVar[RejectReason]
    WRONG_RESULT: _ClassVar[RejectReason]
    NOT_DETERMINISTIC: _ClassVar[RejectReason]
    TIMEOUT: _ClassVar[RejectReason]
    CRASHED: _ClassVar[RejectReason]
    TOO_FAST_TO_BE_TRUE: _ClassVar[RejectReason]
    INPUT_MUTATED: _ClassVar[RejectReason]
    DUPLICATE: _ClassVar[RejectReason]
    INVALID_POINT: _ClassVar[RejectReason]
    STATIC_CHECK: _ClassVar[RejectReason]
    RUNNER_ERROR: _ClassVar[RejectReason]
    UNSUPPORTED_ARCH: _ClassVar[RejectReason]
    LAUNCH_FAILED: _ClassVar[RejectReason]
    DEVICE_FAULT: _ClassVar[RejectReason]
    MEMOISED: _ClassVar[RejectReason]
    OUT_OF_BOUNDS: _ClassVar[RejectReason]
    AGENT_NO_CODE: _ClassVar[RejectReason]
    AGENT_REFUSED: _ClassVar[RejectReason]
    AGENT_TIMEOUT: _ClassVar[RejectReason]
    AGENT_RATE_LIMITED: _ClassVar[RejectReason]
    AGENT_UNAVAILABLE: _ClassVar[RejectReason]
    AGENT_BAD_RESPONSE: _ClassVar[RejectReason]
    AGENT_NOT_CONFIGURED: _ClassVar[RejectReason]
    PROBLEM_ERROR: _ClassVar[RejectReason]

class DeadLetterCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEAD_LETTER_CAUSE_UNSPECIFIED: _ClassVar[DeadLetterCause]
    UNDECODABLE: _ClassVar[DeadLetterCause]
    HARNESS_FAILED: _ClassVar[DeadLetterCause]
    INPUT_MISSING: _ClassVar[DeadLetterCause]
    UNKNOWN_CAMPAIGN: _ClassVar[DeadLetterCause]
    PUBLISH_NOT_PERMITTED: _ClassVar[DeadLetterCause]
    RESULT_TOO_LARGE: _ClassVar[DeadLetterCause]
    DELIVERIES_EXHAUSTED: _ClassVar[DeadLetterCause]
    CAMPAIGN_CANCELLED: _ClassVar[DeadLetterCause]
REJECT_REASON_UNSPECIFIED: RejectReason
COMPILE_ERROR: RejectReason
RESOURCE_LIMIT: RejectReason
WRONG_RESULT: RejectReason
NOT_DETERMINISTIC: RejectReason
TIMEOUT: RejectReason
CRASHED: RejectReason
TOO_FAST_TO_BE_TRUE: RejectReason
INPUT_MUTATED: RejectReason
DUPLICATE: RejectReason
INVALID_POINT: RejectReason
STATIC_CHECK: RejectReason
RUNNER_ERROR: RejectReason
UNSUPPORTED_ARCH: RejectReason
LAUNCH_FAILED: RejectReason
DEVICE_FAULT: RejectReason
MEMOISED: RejectReason
OUT_OF_BOUNDS: RejectReason
AGENT_NO_CODE: RejectReason
AGENT_REFUSED: RejectReason
AGENT_TIMEOUT: RejectReason
AGENT_RATE_LIMITED: RejectReason
AGENT_UNAVAILABLE: RejectReason
AGENT_BAD_RESPONSE: RejectReason
AGENT_NOT_CONFIGURED: RejectReason
PROBLEM_ERROR: RejectReason
DEAD_LETTER_CAUSE_UNSPECIFIED: DeadLetterCause
UNDECODABLE: DeadLetterCause
HARNESS_FAILED: DeadLetterCause
INPUT_MISSING: DeadLetterCause
UNKNOWN_CAMPAIGN: DeadLetterCause
PUBLISH_NOT_PERMITTED: DeadLetterCause
RESULT_TOO_LARGE: DeadLetterCause
DELIVERIES_EXHAUSTED: DeadLetterCause
CAMPAIGN_CANCELLED: DeadLetterCause

class DeviceInfo(_message.Message):
    __slots__ = ("target", "model", "device_id", "threads", "mem_bandwidth_gbps", "peak_gflops", "uuid", "arch", "peak_bf16_gflops", "l2_bytes", "sm_count", "read_bandwidth_gbps", "peak_int8_gops")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    MEM_BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    PEAK_GFLOPS_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    PEAK_BF16_GFLOPS_FIELD_NUMBER: _ClassVar[int]
    L2_BYTES_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    READ_BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    PEAK_INT8_GOPS_FIELD_NUMBER: _ClassVar[int]
    target: str
    model: str
    device_id: str
    threads: int
    mem_bandwidth_gbps: float
    peak_gflops: float
    uuid: str
    arch: str
    peak_bf16_gflops: float
    l2_bytes: int
    sm_count: int
    read_bandwidth_gbps: float
    peak_int8_gops: float
    def __init__(self, target: _Optional[str] = ..., model: _Optional[str] = ..., device_id: _Optional[str] = ..., threads: _Optional[int] = ..., mem_bandwidth_gbps: _Optional[float] = ..., peak_gflops: _Optional[float] = ..., uuid: _Optional[str] = ..., arch: _Optional[str] = ..., peak_bf16_gflops: _Optional[float] = ..., l2_bytes: _Optional[int] = ..., sm_count: _Optional[int] = ..., read_bandwidth_gbps: _Optional[float] = ..., peak_int8_gops: _Optional[float] = ...) -> None: ...

class ManualSource(_message.Message):
    __slots__ = ("name", "source", "compile_flags", "threads", "language", "launch_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FLAGS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    compile_flags: str
    threads: int
    language: str
    launch_json: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., compile_flags: _Optional[str] = ..., threads: _Optional[int] = ..., language: _Optional[str] = ..., launch_json: _Optional[str] = ...) -> None: ...

class CampaignSpec(_message.Message):
    __slots__ = ("problem", "target", "budget_candidates", "budget_seconds", "strategy", "threads", "seed", "families", "manual_sources", "parallel", "warm_start", "coders", "token_budget", "personas", "strategy_options", "budget_device_seconds", "timing_rounds", "showdown_rounds", "showdown_margin", "goal_fraction")
    class StrategyOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FAMILIES_FIELD_NUMBER: _ClassVar[int]
    MANUAL_SOURCES_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    WARM_START_FIELD_NUMBER: _ClassVar[int]
    CODERS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PERSONAS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMING_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SHOWDOWN_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SHOWDOWN_MARGIN_FIELD_NUMBER: _ClassVar[int]
    GOAL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    problem: str
    target: str
    budget_candidates: int
    budget_seconds: float
    strategy: str
    threads: int
    seed: int
    families: _containers.RepeatedScalarFieldContainer[str]
    manual_sources: _containers.RepeatedCompositeFieldContainer[ManualSource]
    parallel: int
    warm_start: int
    coders: _containers.RepeatedScalarFieldContainer[str]
    token_budget: int
    personas: _containers.RepeatedScalarFieldContainer[str]
    strategy_options: _containers.ScalarMap[str, str]
    budget_device_seconds: float
    timing_rounds: int
    showdown_rounds: int
    showdown_margin: float
    goal_fraction: float
    def __init__(self, problem: _Optional[str] = ..., target: _Optional[str] = ..., budget_candidates: _Optional[int] = ..., budget_seconds: _Optional[float] = ..., strategy: _Optional[str] = ..., threads: _Optional[int] = ..., seed: _Optional[int] = ..., families: _Optional[_Iterable[str]] = ..., manual_sources: _Optional[_Iterable[_Union[ManualSource, _Mapping]]] = ..., parallel: _Optional[int] = ..., warm_start: _Optional[int] = ..., coders: _Optional[_Iterable[str]] = ..., token_budget: _Optional[int] = ..., personas: _Optional[_Iterable[str]] = ..., strategy_options: _Optional[_Mapping[str, str]] = ..., budget_device_seconds: _Optional[float] = ..., timing_rounds: _Optional[int] = ..., showdown_rounds: _Optional[int] = ..., showdown_margin: _Optional[float] = ..., goal_fraction: _Optional[float] = ...) -> None: ...

class Prior(_message.Message):
    __slots__ = ("family", "params_json", "score_s", "relative", "device", "campaign_id", "candidate_id")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    SCORE_S_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    family: str
    params_json: str
    score_s: float
    relative: float
    device: str
    campaign_id: str
    candidate_id: str
    def __init__(self, family: _Optional[str] = ..., params_json: _Optional[str] = ..., score_s: _Optional[float] = ..., relative: _Optional[float] = ..., device: _Optional[str] = ..., campaign_id: _Optional[str] = ..., candidate_id: _Optional[str] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("id", "campaign_id", "problem", "target", "family", "point_id", "params_json", "language", "source_digest", "compile_flags", "entry", "threads", "origin", "parents", "fence", "runner_threads", "launch_json", "agent")
    ID_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    POINT_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FLAGS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    RUNNER_THREADS_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_JSON_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    campaign_id: str
    problem: str
    target: str
    family: str
    point_id: str
    params_json: str
    language: str
    source_digest: str
    compile_flags: str
    entry: str
    threads: int
    origin: str
    parents: _containers.RepeatedScalarFieldContainer[str]
    fence: int
    runner_threads: int
    launch_json: str
    agent: AgentInfo
    def __init__(self, id: _Optional[str] = ..., campaign_id: _Optional[str] = ..., problem: _Optional[str] = ..., target: _Optional[str] = ..., family: _Optional[str] = ..., point_id: _Optional[str] = ..., params_json: _Optional[str] = ..., language: _Optional[str] = ..., source_digest: _Optional[str] = ..., compile_flags: _Optional[str] = ..., entry: _Optional[str] = ..., threads: _Optional[int] = ..., origin: _Optional[str] = ..., parents: _Optional[_Iterable[str]] = ..., fence: _Optional[int] = ..., runner_threads: _Optional[int] = ..., launch_json: _Optional[str] = ..., agent: _Optional[_Union[AgentInfo, _Mapping]] = ...) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("backend", "model", "persona", "prompt_digest", "tokens_in", "tokens_out", "attempts", "seconds", "reply_digest", "finish")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PERSONA_FIELD_NUMBER: _ClassVar[int]
    PROMPT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOKENS_IN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_OUT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPLY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    backend: str
    model: str
    persona: str
    prompt_digest: str
    tokens_in: int
    tokens_out: int
    attempts: int
    seconds: float
    reply_digest: str
    finish: str
    def __init__(self, backend: _Optional[str] = ..., model: _Optional[str] = ..., persona: _Optional[str] = ..., prompt_digest: _Optional[str] = ..., tokens_in: _Optional[int] = ..., tokens_out: _Optional[int] = ..., attempts: _Optional[int] = ..., seconds: _Optional[float] = ..., reply_digest: _Optional[str] = ..., finish: _Optional[str] = ...) -> None: ...

class AgentTask(_message.Message):
    __slots__ = ("persona", "device")
    PERSONA_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    persona: str
    device: DeviceInfo
    def __init__(self, persona: _Optional[str] = ..., device: _Optional[_Union[DeviceInfo, _Mapping]] = ...) -> None: ...

class CompileReport(_message.Message):
    __slots__ = ("compiler", "seconds", "artifact_bytes", "imports", "log_digest", "log_excerpt", "warnings", "arch", "registers", "shared_bytes", "stack_bytes", "spill_store_bytes", "spill_load_bytes", "local_bytes", "const_bytes", "cached")
    COMPILER_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_FIELD_NUMBER: _ClassVar[int]
    IMPORTS_FIELD_NUMBER: _ClassVar[int]
    LOG_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LOG_EXCERPT_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    REGISTERS_FIELD_NUMBER: _ClassVar[int]
    SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    STACK_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPILL_STORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPILL_LOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONST_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    compiler: str
    seconds: float
    artifact_bytes: int
    imports: _containers.RepeatedScalarFieldContainer[str]
    log_digest: str
    log_excerpt: str
    warnings: int
    arch: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    local_bytes: int
    const_bytes: int
    cached: bool
    def __init__(self, compiler: _Optional[str] = ..., seconds: _Optional[float] = ..., artifact_bytes: _Optional[int] = ..., imports: _Optional[_Iterable[str]] = ..., log_digest: _Optional[str] = ..., log_excerpt: _Optional[str] = ..., warnings: _Optional[int] = ..., arch: _Optional[str] = ..., registers: _Optional[int] = ..., shared_bytes: _Optional[int] = ..., stack_bytes: _Optional[int] = ..., spill_store_bytes: _Optional[int] = ..., spill_load_bytes: _Optional[int] = ..., local_bytes: _Optional[int] = ..., const_bytes: _Optional[int] = ..., cached: _Optional[bool] = ...) -> None: ...

class Check(_message.Message):
    __slots__ = ("shape", "distribution", "seed", "max_abs_err", "max_rel_err", "norm_rel_err", "passed", "worst_index", "note", "seconds")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERR_FIELD_NUMBER: _ClassVar[int]
    NORM_REL_ERR_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    WORST_INDEX_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    shape: str
    distribution: str
    seed: int
    max_abs_err: float
    max_rel_err: float
    norm_rel_err: float
    passed: bool
    worst_index: int
    note: str
    seconds: float
    def __init__(self, shape: _Optional[str] = ..., distribution: _Optional[str] = ..., seed: _Optional[int] = ..., max_abs_err: _Optional[float] = ..., max_rel_err: _Optional[float] = ..., norm_rel_err: _Optional[float] = ..., passed: _Optional[bool] = ..., worst_index: _Optional[int] = ..., note: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class ShapeTiming(_message.Message):
    __slots__ = ("shape", "median_s", "q1_s", "q3_s", "samples", "noise", "ci_low_s", "ci_high_s", "gbps", "sol_fraction", "output_checked", "telemetry", "mode")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_S_FIELD_NUMBER: _ClassVar[int]
    Q1_S_FIELD_NUMBER: _ClassVar[int]
    Q3_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    CI_LOW_S_FIELD_NUMBER: _ClassVar[int]
    CI_HIGH_S_FIELD_NUMBER: _ClassVar[int]
    GBPS_FIELD_NUMBER: _ClassVar[int]
    SOL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CHECKED_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    shape: str
    median_s: float
    q1_s: float
    q3_s: float
    samples: int
    noise: float
    ci_low_s: float
    ci_high_s: float
    gbps: float
    sol_fraction: float
    output_checked: bool
    telemetry: GpuTelemetry
    mode: str
    def __init__(self, shape: _Optional[str] = ..., median_s: _Optional[float] = ..., q1_s: _Optional[float] = ..., q3_s: _Optional[float] = ..., samples: _Optional[int] = ..., noise: _Optional[float] = ..., ci_low_s: _Optional[float] = ..., ci_high_s: _Optional[float] = ..., gbps: _Optional[float] = ..., sol_fraction: _Optional[float] = ..., output_checked: _Optional[bool] = ..., telemetry: _Optional[_Union[GpuTelemetry, _Mapping]] = ..., mode: _Optional[str] = ...) -> None: ...

class RegressionInput(_message.Message):
    __slots__ = ("problem", "shape", "distribution", "seed", "candidate_id", "campaign_id", "reason", "note")
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    problem: str
    shape: str
    distribution: str
    seed: int
    candidate_id: str
    campaign_id: str
    reason: str
    note: str
    def __init__(self, problem: _Optional[str] = ..., shape: _Optional[str] = ..., distribution: _Optional[str] = ..., seed: _Optional[int] = ..., candidate_id: _Optional[str] = ..., campaign_id: _Optional[str] = ..., reason: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class GpuTelemetry(_message.Message):
    __slots__ = ("model", "uuid", "sm_clock_mhz_before", "sm_clock_mhz_after", "mem_clock_mhz_before", "mem_clock_mhz_after", "temperature_c", "power_w", "throttle_reasons", "throttled", "retries")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_BEFORE_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_AFTER_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_AFTER_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    model: str
    uuid: str
    sm_clock_mhz_before: int
    sm_clock_mhz_after: int
    mem_clock_mhz_before: int
    mem_clock_mhz_after: int
    temperature_c: int
    power_w: float
    throttle_reasons: _containers.RepeatedScalarFieldContainer[str]
    throttled: bool
    retries: int
    def __init__(self, model: _Optional[str] = ..., uuid: _Optional[str] = ..., sm_clock_mhz_before: _Optional[int] = ..., sm_clock_mhz_after: _Optional[int] = ..., mem_clock_mhz_before: _Optional[int] = ..., mem_clock_mhz_after: _Optional[int] = ..., temperature_c: _Optional[int] = ..., power_w: _Optional[float] = ..., throttle_reasons: _Optional[_Iterable[str]] = ..., throttled: _Optional[bool] = ..., retries: _Optional[int] = ...) -> None: ...

class PointProposed(_message.Message):
    __slots__ = ("point_id", "family", "params_json", "strategy", "parents", "fence", "problem", "target", "manual", "origin", "runner_threads", "agent")
    POINT_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    RUNNER_THREADS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    point_id: str
    family: str
    params_json: str
    strategy: str
    parents: _containers.RepeatedScalarFieldContainer[str]
    fence: int
    problem: str
    target: str
    manual: ManualSource
    origin: str
    runner_threads: int
    agent: AgentTask
    def __init__(self, point_id: _Optional[str] = ..., family: _Optional[str] = ..., params_json: _Optional[str] = ..., strategy: _Optional[str] = ..., parents: _Optional[_Iterable[str]] = ..., fence: _Optional[int] = ..., problem: _Optional[str] = ..., target: _Optional[str] = ..., manual: _Optional[_Union[ManualSource, _Mapping]] = ..., origin: _Optional[str] = ..., runner_threads: _Optional[int] = ..., agent: _Optional[_Union[AgentTask, _Mapping]] = ...) -> None: ...

class CandidateCreated(_message.Message):
    __slots__ = ("candidate",)
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ...) -> None: ...

class Compiled(_message.Message):
    __slots__ = ("candidate", "artifact_digest", "report")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    artifact_digest: str
    report: CompileReport
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., artifact_digest: _Optional[str] = ..., report: _Optional[_Union[CompileReport, _Mapping]] = ...) -> None: ...

class CompileFailed(_message.Message):
    __slots__ = ("candidate", "reason", "report", "message")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    reason: RejectReason
    report: CompileReport
    message: str
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., report: _Optional[_Union[CompileReport, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class Verified(_message.Message):
    __slots__ = ("candidate", "artifact_digest", "checks", "seconds", "round")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    artifact_digest: str
    checks: _containers.RepeatedCompositeFieldContainer[Check]
    seconds: float
    round: int
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., artifact_digest: _Optional[str] = ..., checks: _Optional[_Iterable[_Union[Check, _Mapping]]] = ..., seconds: _Optional[float] = ..., round: _Optional[int] = ...) -> None: ...

class Rejected(_message.Message):
    __slots__ = ("candidate", "stage", "reason", "message", "checks", "figures", "point_id", "params_json", "agent")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    POINT_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    stage: str
    reason: RejectReason
    message: str
    checks: _containers.RepeatedCompositeFieldContainer[Check]
    figures: _containers.ScalarMap[str, float]
    point_id: str
    params_json: str
    agent: AgentInfo
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., stage: _Optional[str] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., message: _Optional[str] = ..., checks: _Optional[_Iterable[_Union[Check, _Mapping]]] = ..., figures: _Optional[_Mapping[str, float]] = ..., point_id: _Optional[str] = ..., params_json: _Optional[str] = ..., agent: _Optional[_Union[AgentInfo, _Mapping]] = ...) -> None: ...

class Measured(_message.Message):
    __slots__ = ("candidate", "device", "timings", "score_s", "cached", "replayed", "seconds", "screened_out", "round", "objective")
    class ObjectiveEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SCORE_S_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCREENED_OUT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    device: DeviceInfo
    timings: _containers.RepeatedCompositeFieldContainer[ShapeTiming]
    score_s: float
    cached: bool
    replayed: bool
    seconds: float
    screened_out: bool
    round: int
    objective: _containers.ScalarMap[str, float]
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., device: _Optional[_Union[DeviceInfo, _Mapping]] = ..., timings: _Optional[_Iterable[_Union[ShapeTiming, _Mapping]]] = ..., score_s: _Optional[float] = ..., cached: _Optional[bool] = ..., replayed: _Optional[bool] = ..., seconds: _Optional[float] = ..., screened_out: _Optional[bool] = ..., round: _Optional[int] = ..., objective: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ComparisonEntry(_message.Message):
    __slots__ = ("name", "candidate_id", "timing")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    name: str
    candidate_id: str
    timing: ShapeTiming
    def __init__(self, name: _Optional[str] = ..., candidate_id: _Optional[str] = ..., timing: _Optional[_Union[ShapeTiming, _Mapping]] = ...) -> None: ...

class Comparison(_message.Message):
    __slots__ = ("shape", "entries", "speedups", "candidate_id", "device", "error", "showdown", "failed_candidate", "failed_reason", "checks", "seconds")
    class SpeedupsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SPEEDUPS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SHOWDOWN_FIELD_NUMBER: _ClassVar[int]
    FAILED_CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    FAILED_REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    shape: str
    entries: _containers.RepeatedCompositeFieldContainer[ComparisonEntry]
    speedups: _containers.ScalarMap[str, float]
    candidate_id: str
    device: DeviceInfo
    error: str
    showdown: bool
    failed_candidate: str
    failed_reason: RejectReason
    checks: _containers.RepeatedCompositeFieldContainer[Check]
    seconds: float
    def __init__(self, shape: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[ComparisonEntry, _Mapping]]] = ..., speedups: _Optional[_Mapping[str, float]] = ..., candidate_id: _Optional[str] = ..., device: _Optional[_Union[DeviceInfo, _Mapping]] = ..., error: _Optional[str] = ..., showdown: _Optional[bool] = ..., failed_candidate: _Optional[str] = ..., failed_reason: _Optional[_Union[RejectReason, str]] = ..., checks: _Optional[_Iterable[_Union[Check, _Mapping]]] = ..., seconds: _Optional[float] = ...) -> None: ...

class CompareRequest(_message.Message):
    __slots__ = ("candidate", "reference", "baselines", "candidate_artifact", "reference_artifact", "contenders", "contender_artifacts")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    BASELINES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    CONTENDERS_FIELD_NUMBER: _ClassVar[int]
    CONTENDER_ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    reference: Candidate
    baselines: _containers.RepeatedScalarFieldContainer[str]
    candidate_artifact: str
    reference_artifact: str
    contenders: _containers.RepeatedCompositeFieldContainer[Candidate]
    contender_artifacts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., reference: _Optional[_Union[Candidate, _Mapping]] = ..., baselines: _Optional[_Iterable[str]] = ..., candidate_artifact: _Optional[str] = ..., reference_artifact: _Optional[str] = ..., contenders: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., contender_artifacts: _Optional[_Iterable[str]] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("kind", "problem", "shape", "device", "candidate_id", "value", "text")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    problem: str
    shape: str
    device: str
    candidate_id: str
    value: float
    text: str
    def __init__(self, kind: _Optional[str] = ..., problem: _Optional[str] = ..., shape: _Optional[str] = ..., device: _Optional[str] = ..., candidate_id: _Optional[str] = ..., value: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("stage", "subject", "reason", "deliveries", "payload", "payload_bytes", "cause", "point_id", "candidate_id", "round")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    POINT_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    stage: str
    subject: str
    reason: str
    deliveries: int
    payload: bytes
    payload_bytes: int
    cause: DeadLetterCause
    point_id: str
    candidate_id: str
    round: int
    def __init__(self, stage: _Optional[str] = ..., subject: _Optional[str] = ..., reason: _Optional[str] = ..., deliveries: _Optional[int] = ..., payload: _Optional[bytes] = ..., payload_bytes: _Optional[int] = ..., cause: _Optional[_Union[DeadLetterCause, str]] = ..., point_id: _Optional[str] = ..., candidate_id: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class ResendRequested(_message.Message):
    __slots__ = ("dlq_seq", "requested_by")
    DLQ_SEQ_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    dlq_seq: int
    requested_by: str
    def __init__(self, dlq_seq: _Optional[int] = ..., requested_by: _Optional[str] = ...) -> None: ...

class ResendAnswered(_message.Message):
    __slots__ = ("dlq_seq", "accepted", "reason", "point_id", "subject")
    DLQ_SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    POINT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    dlq_seq: int
    accepted: bool
    reason: str
    point_id: str
    subject: str
    def __init__(self, dlq_seq: _Optional[int] = ..., accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., point_id: _Optional[str] = ..., subject: _Optional[str] = ...) -> None: ...

class Counts(_message.Message):
    __slots__ = ("proposed", "compiled", "compile_failed", "verified", "rejected", "measured")
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FAILED_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    proposed: int
    compiled: int
    compile_failed: int
    verified: int
    rejected: int
    measured: int
    def __init__(self, proposed: _Optional[int] = ..., compiled: _Optional[int] = ..., compile_failed: _Optional[int] = ..., verified: _Optional[int] = ..., rejected: _Optional[int] = ..., measured: _Optional[int] = ...) -> None: ...

class CampaignStarted(_message.Message):
    __slots__ = ("spec", "device", "priors", "known_wrong", "compare_reserve_s", "compare_reserve_campaigns")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PRIORS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_WRONG_FIELD_NUMBER: _ClassVar[int]
    COMPARE_RESERVE_S_FIELD_NUMBER: _ClassVar[int]
    COMPARE_RESERVE_CAMPAIGNS_FIELD_NUMBER: _ClassVar[int]
    spec: CampaignSpec
    device: DeviceInfo
    priors: _containers.RepeatedCompositeFieldContainer[Prior]
    known_wrong: _containers.RepeatedCompositeFieldContainer[KnownWrong]
    compare_reserve_s: float
    compare_reserve_campaigns: int
    def __init__(self, spec: _Optional[_Union[CampaignSpec, _Mapping]] = ..., device: _Optional[_Union[DeviceInfo, _Mapping]] = ..., priors: _Optional[_Iterable[_Union[Prior, _Mapping]]] = ..., known_wrong: _Optional[_Iterable[_Union[KnownWrong, _Mapping]]] = ..., compare_reserve_s: _Optional[float] = ..., compare_reserve_campaigns: _Optional[int] = ...) -> None: ...

class KnownWrong(_message.Message):
    __slots__ = ("candidate_id", "campaign_id", "reason")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    campaign_id: str
    reason: RejectReason
    def __init__(self, candidate_id: _Optional[str] = ..., campaign_id: _Optional[str] = ..., reason: _Optional[_Union[RejectReason, str]] = ...) -> None: ...

class CampaignFinished(_message.Message):
    __slots__ = ("state", "reason", "counts", "best_candidate_id", "summary_json")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    BEST_CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    state: str
    reason: str
    counts: Counts
    best_candidate_id: str
    summary_json: str
    def __init__(self, state: _Optional[str] = ..., reason: _Optional[str] = ..., counts: _Optional[_Union[Counts, _Mapping]] = ..., best_candidate_id: _Optional[str] = ..., summary_json: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("id", "campaign_id", "producer", "time_unix_ns", "campaign_started", "campaign_finished", "point_proposed", "candidate_created", "compiled", "compile_failed", "verified", "rejected", "measured", "comparison", "finding", "dead_letter", "compare_request", "resend_requested", "resend_answered")
    ID_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_STARTED_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    POINT_PROPOSED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_CREATED_FIELD_NUMBER: _ClassVar[int]
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FAILED_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_FIELD_NUMBER: _ClassVar[int]
    FINDING_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    COMPARE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESEND_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    RESEND_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    id: str
    campaign_id: str
    producer: str
    time_unix_ns: int
    campaign_started: CampaignStarted
    campaign_finished: CampaignFinished
    point_proposed: PointProposed
    candidate_created: CandidateCreated
    compiled: Compiled
    compile_failed: CompileFailed
    verified: Verified
    rejected: Rejected
    measured: Measured
    comparison: Comparison
    finding: Finding
    dead_letter: DeadLetter
    compare_request: CompareRequest
    resend_requested: ResendRequested
    resend_answered: ResendAnswered
    def __init__(self, id: _Optional[str] = ..., campaign_id: _Optional[str] = ..., producer: _Optional[str] = ..., time_unix_ns: _Optional[int] = ..., campaign_started: _Optional[_Union[CampaignStarted, _Mapping]] = ..., campaign_finished: _Optional[_Union[CampaignFinished, _Mapping]] = ..., point_proposed: _Optional[_Union[PointProposed, _Mapping]] = ..., candidate_created: _Optional[_Union[CandidateCreated, _Mapping]] = ..., compiled: _Optional[_Union[Compiled, _Mapping]] = ..., compile_failed: _Optional[_Union[CompileFailed, _Mapping]] = ..., verified: _Optional[_Union[Verified, _Mapping]] = ..., rejected: _Optional[_Union[Rejected, _Mapping]] = ..., measured: _Optional[_Union[Measured, _Mapping]] = ..., comparison: _Optional[_Union[Comparison, _Mapping]] = ..., finding: _Optional[_Union[Finding, _Mapping]] = ..., dead_letter: _Optional[_Union[DeadLetter, _Mapping]] = ..., compare_request: _Optional[_Union[CompareRequest, _Mapping]] = ..., resend_requested: _Optional[_Union[ResendRequested, _Mapping]] = ..., resend_answered: _Optional[_Union[ResendAnswered, _Mapping]] = ...) -> None: ...
