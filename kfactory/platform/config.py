"""Typed configuration, read once from the environment (KFACTORY_*) and overridable by CLI flags."""
from __future__ import annotations

import os
from pathlib import Path

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kfactory"   # (set empty: unset)


#: the most of a device budget the search leaves for the showdown and the final comparison, however costly
#: earlier campaigns' were (kfactory.judge.order.compare_reserve): the search always has half
COMPARE_RESERVE_MAX = 0.5
#: the longest device-time budget, a spec's as a planner's (kfactory/platform/spec_ranges.py)
DEVICE_SECONDS_MAX = 366 * 86400.0

#: the default of reference_check_s, in seconds, and the most it may be (a day: a step that long is a hang)
REFERENCE_CHECK_S, REFERENCE_CHECK_MAX_S = 60.0, 86400.0


class Settings(BaseSettings):
    """Every knob of every service. Environment variables are KFACTORY_<FIELD> (e.g. KFACTORY_NATS_URL)."""

    # allow_inf_nan: no setting means anything by nan or inf (KFACTORY_MEASURE_MAX_S=inf timed without end)
    model_config = SettingsConfigDict(env_prefix="KFACTORY_", extra="ignore", allow_inf_nan=False,
                                      secrets_dir=os.environ.get("KFACTORY_SECRETS_DIR") or None)

    bus: Literal["nats", "memory"] = Field("nats", description="nats: NATS JetStream at nats_url (every deployment); "
                                           "memory: an in-process bus (kfactory/bus/memory.py), for tests and one "
                                           "process only")
    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    redis_url: str | None = Field(None, description="redis://host:port/db; unset means in-process claims")
    planner_addr: str = Field("127.0.0.1:50061", description="gRPC address of the Campaigns service")
    memory_addr: str = Field("127.0.0.1:50062", description="gRPC address of the Evidence service")
    memory_timeout_s: float = Field(10.0, gt=0, description="deadline of each query to memory's Evidence "
                                    "service, whoever asks (planner, agents, verifiers, CLI; "
                                    "kfactory/platform/evidence_client.py); bundle transfers have none")
    data_dir: Path = Field(default_factory=_default_data_dir)
    archive_path: Path | None = Field(None, description="SQLite archive; default <data_dir>/archive.sqlite")
    report_dir: Path = Path("reports")

    ack_wait_s: float = Field(30.0, gt=0)
    max_deliver: int = Field(5, ge=1)
    nak_delay_s: float = Field(1.0, ge=0)
    workers: int = Field(1, ge=1, description="concurrent messages per service")
    handler_timeout_s: float = Field(1800.0, gt=0, description="a message's handler still running after this long "
                                     "is stuck: it is cancelled, the await it hung in is logged, and the message "
                                     "is retried (dead-lettered after max_deliver)")

    cc: str = "cc"
    engine_object_cache: Path | None = Field(None, description="a directory of built engine objects that every data "
                                             "directory on this host shares (kfactory/engines/build.py): an engine "
                                             "one workspace built is copied, checked by its sha256, where another "
                                             "would build it again; unset: each data directory builds its own")
    cpu_object_cache: Path | None = Field(None, description="a directory of compiled cpu kernels that every data "
                                          "directory on this host shares (kfactory/targets/cpu/cache.py): a kernel "
                                          "one workspace compiled is read, where another would compile it again; "
                                          "unset: each data directory keeps its own (DATA_DIR/cc_cache)")
    threads: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    runner_timeout_s: float = Field(20.0, gt=0)
    runner_max_runs: int = Field(500, ge=1)
    reference_check_s: float = Field(REFERENCE_CHECK_S, gt=0, le=REFERENCE_CHECK_MAX_S,
                                     description="how long each step of a problem package's check before a campaign "
                                     "(importing its reference.py, one call of reference()) may take before the check "
                                     "fails naming the step (kfactory problems check --timeout)")
    runner_mem_mb: int = Field(4096, ge=256)
    input_reuse: int = Field(8, ge=1, description="candidates that share one draw of a large input set")
    keep_heap: bool = Field(True, description="every kfactory command that may judge kernels (all but `serve` "
                            "planner, coder, compiler or memory) keeps in its heap (one arena for all its threads) "
                            "the memory it frees, so that the judge's next large input set reuses it "
                            "instead of faulting in fresh pages; the heap then never shrinks "
                            "(kfactory/platform/heap.py); false: glibc malloc's defaults")
    compare_one_pass: bool = Field(True, description="outputs are compared with the reference by kfactory's one-pass "
                                   "C helper where it builds (kfactory/judge/numerics.py); false: numpy only")
    runner_arenas: bool = Field(True, description="runners reuse a ring of shared-memory arenas they keep mapped, "
                                "instead of fresh files for every call (kfactory.sandbox.shm.ArenaRing)")
    draw_ahead: bool = Field(True, description="the verifier and the benchmarker draw a candidate's input sets and "
                             "compute their float64 references before taking the device (kfactory.judge.checks."
                             "InputPool.serving), so that the device never waits for them; false: drawn while the "
                             "device is held")
    cpu_arena_mb: int = Field(2048, ge=0, description="the largest request a cpu session's ring of arenas takes "
                              "(three arenas at most that size stay allocated in /dev/shm for the session's life, "
                              "and never more than a twelfth of /dev/shm each: kfactory.sandbox.shm.ring_bytes); a "
                              "larger one gets fresh buffers")
    cpu_cache_mb: int = Field(0, ge=0, description="the last-level cache the cpu target assumes, in MiB (timed calls "
                              "rotate over twice its size of input sets, so none finds its inputs cached); 0: read "
                              "from /sys (a virtual machine may report its host's whole cache, 480 MiB seen, which "
                              "makes every timing take eight large sets)")
    cuda_arena_mb: int = Field(2048, ge=0, description="the largest request a cuda session's ring of arenas takes "
                               "(as cpu_arena_mb)")
    device_judge: bool = Field(False, description="cuda: verification checks of shapes over the judge's large-set "
                               "size draw their inputs, compute the float64 reference and compare the outputs on "
                               "the GPU (kfactory.targets.cuda.judge_device), where the problem ships a "
                               "reference_f64 kernel and its distributions can be drawn there; off until measured "
                               "on a GPU")

    measure_min_samples: int = Field(10, ge=1, description="timed calls of every kernel before a timing may end")
    measure_min_s: float = Field(0.2, ge=0, description="seconds a timing lasts at least")
    measure_max_s: float = Field(0.6, gt=0, description="seconds a timing lasts at most")
    measure_noise: float = Field(0.03, ge=0, description="a timing ends (after measure_min_s) once every kernel's "
                                 "calls vary by at most this fraction (interquartile range over median)")
    measure_precision: float = Field(0.01, ge=0, description=(
        "a timing also ends (after measure_min_s) once every kernel's median is known within this fraction, 95% "
        "confidence, however noisy its calls (0: by measure_noise alone, as before issue 23)"))
    compare_max_s: float = Field(3.0, gt=0, description="seconds the final comparison's timing of a shape lasts at "
                                 "most")
    showdown_contenders: int = Field(4, ge=0, description=(
        "after the search, the best candidate and up to this many less one more whose scores are within "
        "showdown_margin of its score are timed together (rotated: judge/rotated.py) at the shapes the "
        "objective scores (judge/objective.py: the first optimisation shape, unless the package weighs them), and "
        "the fastest is the campaign's result: candidates measured minutes apart on a drifting host are told apart "
        "in one timing (0 or 1: off)"))
    showdown_margin: float = Field(0.15, ge=0, description=(
        "a candidate within this fraction of the best's score is a contender in the showdown: on the 2-core host "
        "the same kernel's median ranged 3.8-6.1 ms over nine timings minutes apart, and at 5% no candidate was "
        "near enough in a campaign whose best was 4% slower than another it had measured"))
    screen_max_s: float = Field(0.05, ge=0, description="multi-fidelity: a screening timing's length (0: off)")
    screen_factor: float = Field(1.5, gt=1, description="screened out when slower than this x the campaign's best")
    judge_order: Literal["screen_first", "verify_first"] = Field(
        "screen_first", description="screen_first: a search candidate (template, warm start, agent) is timed briefly "
        "before it is verified, and one over screen_factor x the campaign's best is recorded as screened out, never "
        "verified; verify_first: every candidate is verified, then screened (the order before issue 23)")
    screen_min_samples: int = Field(3, ge=1, description="timed calls a screening timing makes when its time allows")
    device_seconds: float = Field(0.0, ge=0, le=DEVICE_SECONDS_MAX, description=(
        "device time a campaign's verifications, screens, measurements and comparisons may hold (0: no bound): its "
        "search stops where what is left is its comparisons' reserve (compare_reserve); written at submission into "
        "the spec of every campaign submitted to this planner whose spec sets no budget_device_seconds (so a "
        "restart with another value leaves a running campaign's budget as it was)"))
    compare_reserve: float = Field(0.25, ge=0, le=COMPARE_RESERVE_MAX, description=(
        "under a device budget, the share of it the search leaves for the showdown and the final comparison when "
        "memory knows no earlier completed campaign of the problem on the same target and device model that held "
        "it for them (with that evidence, from the latest five: the median final comparison plus the median "
        "showdown of those that had one; at most half the budget either way; none for an engine): on the 2-core "
        "host they held 26-36% of a 40-candidate softmax campaign's device time"))
    compile_workers: int = Field(0, ge=0, description="compiles at once per compiler service (0: one per core)")
    default_parallel: int = Field(0, ge=0, description="design points in flight when a campaign does not say "
                                  "(0: on cpu three plus one per agent persona, elsewhere one per core plus two: "
                                  "kfactory.judge.order.default_parallel)")
    warm_evidence: int = Field(400, ge=0, description="measurements from other campaigns a warm start learns the "
                               "landscape from (the best --warm of them are also proposed first)")
    precompiled: str = Field("", description="bundles of cubins compiled ahead (kfactory precompile), or folders "
                             "holding them, separated by ':'; the cuda compiler serves a candidate found there "
                             "instead of compiling it")

    # agent coders (LLMs); without a model the factory runs with template coders and says so
    llm_provider: Literal["openai", "anthropic"] = Field(
        "openai", description="openai: the OpenAI-compatible chat API (vLLM, SGLang, Ollama, hosted); "
                              "anthropic: Anthropic's messages API")
    llm_base_url: str | None = Field(None, description="e.g. http://localhost:8000/v1 (vLLM), "
                                                       "http://localhost:11434/v1 (Ollama), https://api.anthropic.com")
    llm_api_key: SecretStr | None = None
    llm_model: str | None = None
    llm_concurrency: int = Field(2, ge=1, description="requests in flight per persona consumer")
    llm_token_budget: int = Field(200_000, ge=0, description="tokens (prompt + reply) one campaign's agents may spend")
    llm_timeout_s: float = Field(180.0, gt=0, description="one request's limit")
    llm_retries: int = Field(2, ge=0, description="retries of a request that timed out, was rate limited or met a 5xx")
    llm_backoff_s: float = Field(1.0, ge=0, description="first retry's delay; doubles per retry (with jitter)")
    llm_max_wait_s: float = Field(60.0, ge=0, description="longest Retry-After honoured before giving up")
    llm_reask: int = Field(1, ge=0, description="times a reply without a kernel is answered with a request to fix it")
    llm_max_tokens: int = Field(8192, ge=256, description="reply length limit")
    llm_temperature: float = Field(0.7, ge=0, le=2)
    llm_parents: int = Field(2, ge=1, le=3, description="parent candidates (with their evidence) per prompt")
    llm_token_seconds: float = Field(1e-3, ge=0, description="device-seconds one token is worth when the planner "
                                                             "weighs coders' yields")

    # the replay target's pace: 0 answers at once; 1 sleeps each recorded compile and benchmark time (a cluster
    # simulated in real time; fault tests use a fraction so that work is in flight when they strike)
    replay_pace: float = Field(0.0, ge=0)

    # boundaries: what is refused, with a reason, before it can exhaust anything
    max_event_bytes: int = Field(1 << 20, ge=1024, description="largest protobuf event a service decodes")
    max_source_bytes: int = Field(512 << 10, ge=1024, description="largest kernel source the coder accepts")

    # the secure profile: credentials come from the environment or from files in KFACTORY_SECRETS_DIR (never
    # logged: SecretStr prints as '**********')
    redis_password: SecretStr | None = Field(None, description="Redis AUTH password (added to redis_url)")
    grpc_token: SecretStr | None = Field(None, description="bearer token the gRPC services demand (secure profile)")
    grpc_tls_cert: Path | None = Field(None, description="PEM certificate the gRPC servers present")
    grpc_tls_key: Path | None = Field(None, description="PEM private key of grpc_tls_cert")
    grpc_tls_ca: Path | None = Field(None, description="PEM CA bundle clients trust (default: grpc_tls_cert)")

    log_level: str | None = Field(None, description="debug, info, warning or error; unset: info for `serve`, "
                                                    "warning for `run` and `problems` (--log-level wins)")
    log_json: bool = Field(False, description="JSON log lines (always for `serve`)")

    # observability (kfactory/observability/tracing.py, kfactory/observability/)
    trace_file: Path | None = Field(None, description="append every finished span as a JSON line to this file")
    trace_console: bool = Field(False, description="print finished spans on stdout (local debugging)")
    otlp_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("KFACTORY_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint"),
        description="OTLP/gRPC collector for spans, e.g. http://otel-collector:4317")
    otlp_insecure: bool = Field(True, description="plaintext gRPC to the collector (in-cluster); false: TLS")
    trace_sample_ratio: float = Field(1.0, ge=0, le=1, description="fraction of new traces kept")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="serve Prometheus /metrics here (0: a free "
                                                                         "port; unset: no endpoint)")
    stream_replicas: int = Field(1, ge=1, le=5, description="copies of each JetStream stream a service creates "
                                                         "(3 on a 3-server NATS cluster)")
    metrics_poll_s: float = Field(2.0, gt=0, description="seconds between readings of a consumer's lag")
    health_addr: str | None = Field(None, description="gRPC health service of `kfactory serve`, e.g. 0.0.0.0:8081 "
                                                      "(Kubernetes probes); unset: none")

    @field_validator("engine_object_cache", "cpu_object_cache", "archive_path", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value   # else Path("") is the working directory, which nobody asked for

    @field_validator("data_dir", mode="before")
    @classmethod
    def _empty_is_the_default(cls, value: object) -> object:
        # KFACTORY_DATA_DIR= (set, empty) made the working directory the workspace, which nobody asked for
        return _default_data_dir() if value == "" else value

    @field_validator("engine_object_cache", "cpu_object_cache")
    @classmethod
    def _shared_by_absolute_path(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.expanduser().is_absolute():
            raise ValueError(f"{value} must be an absolute path: every service would find a relative one under "
                             "its own working directory")
        return value.expanduser()

    @model_validator(mode="after")
    def _handlers_outlast_their_work(self) -> "Settings":
        worst = self.llm_worst_case_s()
        if self.llm_configured() and self.handler_timeout_s <= worst:
            raise ValueError(f"handler_timeout_s ({self.handler_timeout_s:g} s) must exceed an agent's worst case "
                             f"with these llm_* settings ({worst:g} s: every request, retry and re-ask timing out): "
                             "raise KFACTORY_HANDLER_TIMEOUT_S or lower KFACTORY_LLM_TIMEOUT_S / _RETRIES / _REASK")
        return self

    def llm_worst_case_s(self) -> float:
        """The longest one agent handler can legitimately wait on its model: every request and retry timing out,
        with the longest backoff between them, for the first ask and each re-ask."""
        per_ask = self.llm_timeout_s * (self.llm_retries + 1) + self.llm_max_wait_s * self.llm_retries
        return per_ask * (self.llm_reask + 1)

    def llm_configured(self) -> bool:
        """True when agent coders have an endpoint and a model to call."""
        return bool(self.llm_base_url and self.llm_model)

    def oversized(self, source: str) -> str:
        """Why a kernel source is too large to take ("N bytes, over the L-byte limit (KFACTORY_MAX_SOURCE_BYTES)"),
        or "" when it is not: one rule for a spec's hand-written kernels, the coder's output and `kfactory check`."""
        size = len(source.encode())
        if size <= self.max_source_bytes:
            return ""
        return f"{size} bytes, over the {self.max_source_bytes}-byte limit (KFACTORY_MAX_SOURCE_BYTES)"

    def archive(self) -> Path:
        """Where memory keeps its SQLite archive."""
        return self.archive_path or self.data_dir / "archive.sqlite"
