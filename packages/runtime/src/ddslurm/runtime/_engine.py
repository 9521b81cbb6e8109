"""The one place that drives Data Designer: build the providers and config from the snapshot, run create().

Data Designer reads several environment variables at import time, so :func:`engine_environment` must be
applied to ``os.environ`` before this module's functions import it (the CLI does that first thing).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddslurm.config import (
    PluginRecord,
    ProviderSnapshot,
    RecipeSource,
    SeedRows,
    ServingPlan,
    SnapshotModel,
    SnapshotProvider,
    frozen_imports,
    recipe_section,
    recipe_with_models,
)
from ddslurm.runtime._builder import rebuilt_columns
from ddslurm.runtime._columns import recipe_columns
from ddslurm.runtime._node_recipe import node_builder
from ddslurm.runtime._plugins import check_plugins
from ddslurm.runtime._run_config import applied_run_config, engine_run_config
from ddslurm.runtime._verify import rows_in
from ddslurm.runtime.errors import EngineError, KeyRefusedError, ProviderUnavailableError, RecipeError

LOCAL_TOKEN_ENV = "DDSLURM_LOCAL_TOKEN"
"""The variable holding the attempt's token for a local provider whose snapshot entry names none (snapshots
written before local providers named it)."""

# sha1 of tiktoken's cl100k_base blob URL: the cache file name tiktoken looks for.
_CL100K_CACHE_NAME = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


def engine_environment(scratch_home: Path) -> dict[str, str]:
    """Variables that keep Data Designer offline and out of the user's home directory."""
    return {
        "DATA_DESIGNER_HOME": str(scratch_home),
        "DATA_DESIGNER_MANAGED_ASSETS_PATH": str(scratch_home / "managed-assets"),
        "NEMO_TELEMETRY_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
    }


UNUSED_ENDPOINT = "http://127.0.0.1:9/v1"
"""The endpoint of a provider no request is sent to (port 9, discard)."""


def unused_provider() -> Any:
    """A model provider never contacted: Data Designer needs one even for a recipe without model columns (and its
    validation sends no request)."""
    import data_designer.config as dd

    return dd.ModelProvider(name="ddslurm-unused", endpoint=UNUSED_ENDPOINT, api_key=None)


def provider_key_env(provider: SnapshotProvider) -> str | None:
    """The API-key variable Data Designer resolves for ``provider``: a local provider's is always a variable that
    holds the attempt's token (only in the client step's environment)."""
    if provider.local:
        return provider.api_key_env or LOCAL_TOKEN_ENV
    return provider.api_key_env


def local_token_names(snapshot: ProviderSnapshot) -> tuple[str, ...]:
    """The variables the client step gets the attempt's token in: each local provider's key variable."""
    return tuple(sorted({p.api_key_env or LOCAL_TOKEN_ENV for p in snapshot.providers if p.local}))


@dataclass(frozen=True, slots=True)
class EngineRequest:
    recipe: Mapping[str, Any]
    snapshot: ProviderSnapshot
    endpoints: Mapping[str, str]
    artifact_path: Path
    scratch_home: Path
    dataset_name: str
    num_records: int
    buffer_size: int
    serving: ServingPlan | None
    """The plan's deployments: their ``max_parallel_requests`` go into the local aliases' model configs."""
    on_batch_complete: Callable[[Path], None] | None = None
    on_cell: Callable[[], None] | None = None
    """Called (from Data Designer's worker threads) each time a cell of a cell-by-cell column is done."""
    resume: bool = False
    """Continue the dataset already in ``artifact_path / dataset_name`` (Data Designer's ResumeMode.ALWAYS)."""
    preserve_dropped_columns: bool = False
    """Data Designer writes what its drop processors remove to ``dropped-columns-parquet-files/``, row for row with
    the batches (a CPU stage's seed row numbers: which rows a fill must make again)."""
    source: RecipeSource | None = None
    """The builder script the recipe was made from: its ``rebuild`` columns are taken from running it here."""
    plugins: tuple[PluginRecord, ...] = ()
    """The plugins the plan was made with: checked installed here before anything runs."""
    hosted_wait_s: int = 0
    """How long the client's gate may hold a hosted request (0: no gate): added to the hosted aliases' timeouts."""
    hosted_check: HostedCheck | None = None
    """Data Designer's start-up check of hosted models, made by the client's gate under the keys' budgets
    (:meth:`HostedGate.checker`): asked for the hosted models the recipe's columns use before Data Designer starts;
    the aliases that answered skip Data Designer's own check (:func:`checked_aliases`). None: Data Designer's own."""
    run_config: Mapping[str, Any] = field(default_factory=dict)
    """The run file's ``run_config`` (``Plan.run_config``): Data Designer ``RunConfig`` fields, under ddslurm's own
    (``buffer_size``, ``otel_metrics_port``, ``preserve_dropped_columns``)."""
    on_run_config: Callable[[Mapping[str, Any]], None] | None = None
    """Called, before ``create()``, with the values the engine's ``RunConfig`` holds for the ``run_config`` fields
    (:func:`~ddslurm.runtime._run_config.applied_run_config`); not called without any."""


@dataclass(frozen=True, slots=True)
class EngineResult:
    dataset_dir: Path
    rows: int
    requested: int
    stopped_early: bool = False
    """Data Designer stopped at its early-shutdown gate (too many failed requests, ``RunConfig``'s
    ``shutdown_error_rate``) and kept the records it had: Data Designer 1.0 says so (``early_shutdown``); older
    versions return such a short dataset as if records had been dropped."""


def _estimate_tokens_offline() -> None:
    """Without tiktoken's cl100k_base file the profiler would try to download it for every LLM column
    (and on reasoning responses): swap in a len/4 estimate so a node without internet never waits on it."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    cache_dir = Path(cache) if cache else Path(tempfile.gettempdir()) / "data-gym-cache"
    if (cache_dir / _CL100K_CACHE_NAME).is_file():
        return
    from data_designer.engine.utils import token_counting

    class _Estimate:
        def encode(self, text: str, **_: Any) -> list[int]:
            return [0] * max(1, (len(text) + 3) // 4) if text else []

    token_counting.get_cl100k_base_tokenizer = lambda: _Estimate()


@functools.cache
def _rebuilt(source: RecipeSource) -> dict[str, Any]:
    """The builder's own configs of the columns the YAML does not carry, once per process (a fill runs again)."""
    return rebuilt_columns(source, source.rebuild)


def mcp_providers(snapshot: ProviderSnapshot, env: Mapping[str, str]) -> list[Any]:
    """Data Designer's MCP providers of the snapshot: a remote one's ``api_key`` is its variable's name (Data
    Designer's ``EnvironmentResolver`` reads it), a stdio one's ``env_from`` variables are read from ``env`` (the
    client step's environment) now, into the provider object only (never written)."""
    import data_designer.config as dd

    built: list[Any] = []
    for p in snapshot.mcp_providers:
        if p.provider_type == "stdio":
            values = {name: env.get(var, "") for name, var in p.env_from.items()}
            built.append(
                dd.LocalStdioMCPProvider(name=p.name, command=p.command or "", args=list(p.args), env=p.env | values)
            )
        else:
            built.append(
                dd.MCPProvider(
                    name=p.name, endpoint=p.endpoint or "", api_key=p.api_key_env, provider_type=p.provider_type
                )
            )
    return built


def run_engine(request: EngineRequest) -> EngineResult:
    """Run Data Designer for one shard and return where it wrote the dataset and how many rows it made."""
    import data_designer.config as dd
    from data_designer.engine.secret_resolver import EnvironmentResolver
    from data_designer.interface import DataDesigner

    _estimate_tokens_offline()
    providers = []
    for p in request.snapshot.providers:
        endpoint = request.endpoints.get(p.name, p.endpoint)  # a local one's replicas, a hosted one's gate
        providers.append(
            dd.ModelProvider(
                name=p.name,
                endpoint=endpoint,
                provider_type=p.provider_type,
                api_key=provider_key_env(p),
                extra_body=p.extra_body,
                extra_headers=p.extra_headers,
            )
        )
    check_plugins(request.plugins)
    source = request.source
    rebuilt = _rebuilt(source) if source is not None and source.rebuild else {}
    checked: frozenset[str] = frozenset()
    if request.hosted_check is not None:
        try:
            used = {alias for column in recipe_columns(request.recipe) for alias in column.aliases}
        except RecipeError:  # a column type only its builder script defines: every model the run's snapshot holds
            used = {m.alias for m in request.snapshot.models}
        answered = request.hosted_check([m for m in request.snapshot.models if m.alias in used])
        checked = checked_aliases(answered, request.snapshot)
    models = recipe_with_models(
        request.recipe, request.snapshot, request.serving, hosted_wait_s=request.hosted_wait_s, checked=checked
    )
    builder = node_builder(models, rebuilt)
    designer = DataDesigner(
        artifact_path=request.artifact_path,
        model_providers=providers or [unused_provider()],
        mcp_providers=mcp_providers(request.snapshot, os.environ),
        secret_resolver=EnvironmentResolver(),
        managed_assets_path=request.scratch_home / "managed-assets",
    )
    designer.set_run_config(
        engine_run_config(
            request.run_config,
            buffer_size=request.buffer_size,
            otel_metrics_port=None,
            preserve_dropped_columns=request.preserve_dropped_columns,
        )
    )
    if request.on_run_config is not None and request.run_config:
        request.on_run_config(applied_run_config(designer.run_config, request.run_config))
    violations: list[Any] = []
    try:
        with violations_reported(violations), _cells_reported(request.on_cell):
            results = designer.create(
                builder,
                num_records=request.num_records,
                dataset_name=request.dataset_name,
                resume=dd.ResumeMode.ALWAYS if request.resume else dd.ResumeMode.NEVER,
                on_batch_complete=request.on_batch_complete,
            )
    except Exception as exc:
        name = type(exc).__name__
        if name == "DataDesignerProfilingError":
            # The statistics Data Designer computes after writing every batch failed (0.9.7 fails on a one-record
            # dataset with an int expression column): the dataset itself is complete, and verification checks it.
            dataset_dir = request.artifact_path / request.dataset_name
            rows = rows_in(dataset_dir / "parquet-files")
            return EngineResult(dataset_dir=dataset_dir, rows=rows, requested=request.num_records)
        refusal = key_refused(exc, request.snapshot)
        if refusal is not None:
            raise refusal from exc
        outage = provider_unavailable(exc)
        if outage is not None:
            raise outage from exc
        refused = violation_lines(violations)
        if refused or _refuses_config(exc):  # the recipe (and the Data Designer on this node) will not change
            details = refused or [f"{name}: {exc}"]
            raise RecipeError("Data Designer refuses the recipe: " + "; ".join(details)) from exc
        retryable = "EarlyShutdown" not in name and "Validation" not in name
        raise EngineError(f"Data Designer failed: {name}: {exc}", retryable=retryable) from exc
    return engine_result(results, request.num_records)


def engine_result(results: Any, requested: int) -> EngineResult:
    """What ``create()``'s ``results`` say about the dataset: where it is, its rows (Data Designer 1.0 counts them
    from the batch files, ``actual_num_records``; older versions load the dataset) and whether generation stopped
    early (1.0's ``early_shutdown``; never with older versions)."""
    dataset_dir = Path(results.artifact_storage.base_dataset_path)
    counted = getattr(results, "actual_num_records", None)
    rows = counted if isinstance(counted, int) else len(results.load_dataset())
    return EngineResult(
        dataset_dir=dataset_dir,
        rows=rows,
        requested=requested,
        stopped_early=getattr(results, "early_shutdown", None) is True,
    )


# Data Designer's errors about the config itself, by class name (any class of the exception's MRO), so that the
# check holds for every supported version without importing each class: a rerun can never change the outcome.
_CONFIG_ERRORS = {
    "InvalidConfigError",
    "BuilderConfigurationError",
    "InvalidColumnTypeError",
    "InvalidFilePathError",
    "InvalidFileFormatError",
    "UnknownProviderError",
    "NoModelProvidersError",
    "SecretResolutionError",
    "ValidationError",  # pydantic's
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from (``create`` wraps everything in DataDesignerGenerationError; Data Designer
    raises its model errors ``from None``, which keeps the provider's error as their context), ten at most."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _says_unavailable(seen: BaseException) -> bool:
    code = getattr(seen, "status_code", None)
    statused = isinstance(code, int) and code in _UNAVAILABLE_STATUSES
    return statused or any(cls.__name__ in _UNAVAILABLE_ERRORS for cls in type(seen).__mro__)


def _named_provider(exc: BaseException) -> str | None:
    """The provider that ``exc`` or what it was raised from names (``provider_name``; the innermost that does)."""
    named = (getattr(seen, "provider_name", None) for seen in _chain(exc))
    return next((n for n in reversed(list(named)) if isinstance(n, str)), None)


def _refuses_config(exc: BaseException) -> bool:
    """Whether ``exc`` or what it was raised from is an error about the config."""
    return any(cls.__name__ in _CONFIG_ERRORS for seen in _chain(exc) for cls in type(seen).__mro__)


# Data Designer's errors for a provider that is unavailable for now (rate limited, failing, unreachable, too slow),
# by class name as above (ModelRequestAdmissionTimeoutError is a ModelTimeoutError), and the HTTP statuses of such
# answers when an error carries its ``status_code``.
_UNAVAILABLE_ERRORS = frozenset(
    {"ModelRateLimitError", "ModelInternalServerError", "ModelAPIConnectionError", "ModelTimeoutError"}
)
_UNAVAILABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def provider_unavailable(exc: BaseException) -> ProviderUnavailableError | None:
    """The failure when ``exc`` (or what it was raised from) says a provider is unavailable for now: Data Designer's
    rate-limit, server-error, connection or timeout errors (its start-up health check is not retried by Data
    Designer; its generation requests are, and reach here only once those retries are spent), or a provider error
    whose ``status_code`` is 408, 429 or 5xx. None for anything else."""
    if not any(_says_unavailable(seen) for seen in _chain(exc)):
        return None
    provider = _named_provider(exc)
    which = f"provider {provider!r}" if provider else "a provider"
    return ProviderUnavailableError(f"{which} is unavailable: {type(exc).__name__}: {exc}", provider=provider)


# Data Designer's errors for a key an endpoint refused, by class name as above, with the HTTP status they stand for.
_KEY_ERRORS = {"ModelAuthenticationError": 401, "ModelPermissionDeniedError": 403}
_KEY_STATUSES = frozenset(_KEY_ERRORS.values())


def key_refused(exc: BaseException, snapshot: ProviderSnapshot) -> KeyRefusedError | None:
    """The failure when ``exc`` (or what it was raised from) says that a hosted provider's endpoint refused the API
    key: Data Designer's ``ModelAuthenticationError`` or ``ModelPermissionDeniedError`` (every supported version),
    or a provider error whose ``status_code`` is 401 or 403; the provider is the one that error names
    (``provider_name``). None for any other error, and for a local provider (its key is the attempt's own token,
    never the user's)."""
    status: int | None = None
    for seen in _chain(exc):
        code = getattr(seen, "status_code", None)
        if isinstance(code, int) and code in _KEY_STATUSES:
            status = code
        elif status is None:
            status = next((_KEY_ERRORS[c.__name__] for c in type(seen).__mro__ if c.__name__ in _KEY_ERRORS), None)
    if status is None:
        return None
    provider_name = _named_provider(exc)
    hosted = [p for p in snapshot.providers if not p.local]
    named_providers = [p for p in hosted if p.name == provider_name]
    if provider_name is not None and not named_providers:
        return None  # a local provider's server (or one the snapshot does not know) refused the attempt's token
    refusing = named_providers or hosted
    if not refusing:
        return None
    return refused_key_error(refusing, status, "Data Designer: " + " ".join(str(exc).split()))


HostedCheck = Callable[[Sequence[SnapshotModel]], Mapping[str, int]]
"""Hosted models in, the HTTP status each one's provider answered to a start-up request out, by alias."""

CHECK_FAILS = _KEY_STATUSES | _UNAVAILABLE_STATUSES
"""Answers to the start-up check that fail the attempt (:func:`checked_aliases`): a refused key, or a provider
unavailable for now (the attempt waits it out)."""


def checked_aliases(answered: Mapping[str, int], snapshot: ProviderSnapshot) -> frozenset[str]:
    """The aliases the start-up check found answering (Data Designer need not check them again);
    :class:`KeyRefusedError` for a 401 or 403, :class:`ProviderUnavailableError` for a 408, 429 or 5xx, as Data
    Designer's own check fails. Any other answer (a wrong model name, a parameter the provider refuses) is left to
    Data Designer's own check, which says what is wrong in its own words."""
    models = {m.alias: m for m in snapshot.models}
    providers = {p.name: p for p in snapshot.providers}
    for alias, status in answered.items():
        provider = providers[models[alias].provider]
        if status in _KEY_STATUSES:
            raise refused_key_error([provider], status, f"(the start-up check of model alias {alias!r})")
        if status in _UNAVAILABLE_STATUSES:
            raise ProviderUnavailableError(
                f"provider {provider.name!r} is unavailable: it answered HTTP {status} to the start-up check of "
                f"model alias {alias!r}",
                provider=provider.name,
            )
    return frozenset(a for a, status in answered.items() if 200 <= status < 300)


def refused_key_error(refusing: Sequence[SnapshotProvider], status: int, detail: str) -> KeyRefusedError:
    """The failure of hosted providers whose endpoint answered ``status`` (401 or 403) to the job's key."""
    names = ", ".join(repr(p.name) for p in refusing)
    keys = sorted({p.api_key_env for p in refusing if p.api_key_env})
    what = f"the API key in {', '.join(keys)}" if keys else "the request without an API key"
    return KeyRefusedError(
        f"the endpoint of provider {names} refused {what} (HTTP {status}): export the right key in the shell you "
        f"submit from, then `ddslurm retry RUN`; never rerun or retried automatically. {detail}"
    )


@contextmanager
def violations_reported(recorded: list[Any]) -> Iterator[None]:
    """Data Designer prints its validation violations (which column, what is wrong) and then raises a generic
    ``InvalidConfigError`` ("Please address the indicated issues"): keep the violations it reports in ``recorded``."""
    try:
        from data_designer.engine import compiler

        report = compiler.rich_print_violations
    except (ImportError, AttributeError):  # another Data Designer version: its exception's text only
        yield
        return

    def record(violations: list[Any]) -> None:
        recorded.extend(violations)
        report(violations)

    compiler.rich_print_violations = record
    try:
        yield
    finally:
        compiler.rich_print_violations = report


@contextmanager
def _cells_reported(on_cell: Callable[[], None] | None) -> Iterator[None]:
    """Call ``on_cell`` whenever Data Designer's progress tracker counts a finished cell (success, failure or skip):
    Data Designer reports that progress only to its log, so the tracker's one counting method is wrapped for the
    duration of ``create()`` (this process runs one ``create()`` at a time). Without the tracker (another Data
    Designer version), nothing is reported and nothing fails."""
    if on_cell is None:
        yield
        return
    try:
        from data_designer.engine.progress.tracker import ProgressTracker

        original = ProgressTracker._record_completion
    except (ImportError, AttributeError):
        yield
        return

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            on_cell()
        except Exception:  # progress reporting never fails generation
            pass
        return result

    ProgressTracker._record_completion = counted
    try:
        yield
    finally:
        ProgressTracker._record_completion = original


def violation_lines(violations: list[Any]) -> list[str]:
    lines = []
    for v in violations:
        level = getattr(v, "level", "")
        if str(getattr(level, "value", level)).lower() != "error":
            continue
        column, message = getattr(v, "column", None), str(getattr(v, "message", v)).strip()
        lines.append(f"column {column!r}: {message}" if column else message)
    return lines


def seed_reader(source: Mapping[str, Any]) -> Any:
    """Data Designer's own reader for a seed ``source`` (``seed_config.source``), attached: the built-in seed
    types ddslurm captures (local files and patterns, directory, file_contents, agent_rollout)."""
    from data_designer.config.seed import SeedConfig
    from data_designer.engine.resources.seed_reader import (
        AgentRolloutSeedReader,
        DirectorySeedReader,
        FileContentsSeedReader,
        LocalFileSeedReader,
        SeedReaderRegistry,
    )
    from data_designer.engine.secret_resolver import EnvironmentResolver

    config = SeedConfig.model_validate({"source": dict(source)})
    readers = [LocalFileSeedReader(), DirectorySeedReader(), FileContentsSeedReader(), AgentRolloutSeedReader()]
    return SeedReaderRegistry(readers).get_reader(config.source, EnvironmentResolver())


def read_seed_block(recipe: Mapping[str, Any], block: SeedRows) -> Any:
    """The seed rows ``block`` (a shard's: :func:`~ddslurm.config.shard_seed_rows`) of the recipe's seed dataset,
    in order, as Data Designer's own seed reader produces them (hydrated rows for directory sources), as a
    ``pyarrow.Table``."""
    import pyarrow as pa
    from data_designer.config.seed import IndexRange

    seed = recipe_section(recipe).get("seed_config")
    if not isinstance(seed, dict):
        raise EngineError("the recipe has no seed dataset", retryable=False)
    reader = seed_reader(seed["source"])
    batches = reader.create_batch_reader(
        batch_size=block.rows, index_range=IndexRange(start=block.start, end=block.end), shuffle=False
    )
    tables = []
    while True:
        try:
            batch = batches.read_next_batch()
        except StopIteration:
            break
        if isinstance(batch, pa.RecordBatch):
            tables.append(pa.Table.from_batches([batch]))
        else:
            tables.append(pa.Table.from_pandas(batch.to_pandas(), preserve_index=False))
    if not tables:
        raise EngineError(f"the seed dataset has no rows {block.start}..{block.end}", retryable=False)
    return pa.concat_tables(tables, promote_options="default")


PRELOAD_MODULES = (
    "data_designer.config.config_builder",
    "data_designer.config.run_config",
    "data_designer.config.analysis.dataset_profiler",
    "data_designer.interface.data_designer",
    "data_designer.interface.composite_workflow",
    "data_designer.engine.secret_resolver",
    "data_designer.engine.compiler",
    "data_designer.engine.models.facade",
    "data_designer.engine.dataset_builders.dataset_builder",
    "data_designer.engine.analysis.dataset_profiler",
    "data_designer.integrations.opentelemetry",
    "duckdb",
)
"""What ``create()`` imports before its first request (Data Designer 0.9.7, ``python -X importtime``). Its
packages import their contents lazily, so importing ``data_designer.config`` and ``data_designer.interface``
alone loads almost nothing: the seconds of imports came after the servers were ready (docs/performance.md,
"Runtime start-up")."""


def preload_engine(modules: tuple[str, ...] = PRELOAD_MODULES) -> list[str]:
    """Import Data Designer ahead of the run (seconds of imports), so that a client step started while the model
    servers load is ready to send its first request as soon as they are. A module another Data Designer version
    does not have is skipped (it imports what it needs when used); returns the ones skipped. The imports run
    with the cyclic garbage collector off, and what they built is frozen (:func:`ddslurm.config.frozen_imports`):
    the run's collections, and the exit's, no longer walk Data Designer's classes."""
    import importlib

    skipped = []
    with frozen_imports():
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError:
                skipped.append(name)
    return skipped
