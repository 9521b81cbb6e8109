"""A builder script (``recipe: build.py``) or ``module:function``, loaded and called the way Data Designer's CLI
loads a ``.py`` config source (``data_designer/cli/utils/config_loader.py``).

It runs in the profile's ``python_env`` (with its plugins and the user's packages): at submit in
``ddslurm-runtime inspect`` (:mod:`ddslurm.runtime._inspect`), whose ``build`` answers a
:class:`~ddslurm.config.BuildRequest` with a :class:`~ddslurm.config.BuildAnswer` (for a builder that returns a
Data Designer workflow, ``workflow`` is its shape and ``yaml`` the config of the stage ``stage`` of the request,
seeded from its ``seed``: :mod:`ddslurm.runtime._workflow`; not ``ok``, ``error`` at ``file``:``line``); and on
the node when the config it returns does not survive Data Designer's YAML round trip (``RecipeSource.rebuild``):
then the client step runs the run's copy of the script (:func:`rebuilt_columns`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from ddslurm.config import (
    DD_BUILDER_FUNCTION,
    BuildAnswer,
    BuildRequest,
    CodeLine,
    GivenMCPProvider,
    RecipeSource,
    WorkflowShape,
)
from ddslurm.runtime._plugins import PLUGIN_GROUP
from ddslurm.runtime._workflow import is_workflow, shape, stage_builder, stage_of
from ddslurm.runtime.errors import BuilderFailure, RecipeError


def _installed_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parents[1])}
    with contextlib.suppress(ImportError, AttributeError):
        import ddslurm

        roots |= {str(Path(p).resolve()) for p in ddslurm.__path__}
    return tuple(sorted(roots))


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The traceback's frames in the user's own files (not Python's, not installed packages', not ddslurm's)."""
    return _own(traceback.extract_tb(exc.__traceback__))


def _own(summary: traceback.StackSummary) -> list[traceback.FrameSummary]:
    roots = _installed_roots()
    frames = []
    for frame in summary:
        name = frame.filename
        if name.startswith("<") or any(name.startswith(root + os.sep) for root in roots):
            continue
        frames.append(frame)
    return frames


def _raised(exc: BaseException, what: str, fallback: str | None, fallback_line: int | None = None) -> BuilderFailure:
    """``what`` raised ``exc``: placed at the deepest line of the user's code, with those frames."""
    if isinstance(exc, SystemExit):
        detail = f"called sys.exit({exc.code!r})"
    else:
        detail = f"raised {type(exc).__name__}: {str(exc).strip() or '(no message)'}"
    file, line = fallback, fallback_line
    if isinstance(exc, SyntaxError) and exc.filename:
        file, line = exc.filename, exc.lineno
    frames = _user_frames(exc)
    if frames and not isinstance(exc, SyntaxError):
        file, line = frames[-1].filename, frames[-1].lineno
    trace = "".join(
        f"\n    {f.filename}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else "") for f in frames[-6:]
    )
    return BuilderFailure(f"{what} {detail}" + (f"\n  traceback (your code):{trace}" if trace else ""), file, line)


def _module_name(path: Path) -> str:
    """The name a script is loaded as (Data Designer's CLI's)."""
    return f"_dd_config_{path.resolve().as_posix().replace('/', '_').replace('.', '_')}"


def _load_script(path: Path, copy: Path | None = None) -> ModuleType:
    """The script as a module, exactly as Data Designer's CLI loads a ``.py`` config source; with ``copy``, the
    source is read from there while the module is ``path`` (``__file__``, sibling imports)."""
    module_name = _module_name(path)
    loader = None if copy is None else importlib.machinery.SourceFileLoader(module_name, str(copy))
    spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)
    if spec is None or spec.loader is None:
        raise BuilderFailure("cannot be loaded as a Python module", str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    parent = str(path.resolve().parent)
    if parent not in sys.path:  # sibling helper modules import, as with Data Designer's CLI
        sys.path.insert(0, parent)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        raise _raised(exc, "running the script", str(path)) from None
    return module


_LOOKED = "looked beside the run file, on PYTHONPATH and in ddslurm's Python environment"


def _import_module(name: str, run_dir: str) -> tuple[ModuleType, Path]:
    sys.path.insert(0, run_dir)
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as exc:
        raise BuilderFailure(f"module {name!r} cannot be imported: {exc} ({_LOOKED})") from None
    except (Exception, SystemExit) as exc:
        raise _raised(exc, f"importing the packages of {name!r}", None) from None
    if spec is None:
        raise BuilderFailure(f"module {name!r} was not found ({_LOOKED})")
    if spec.origin is None or not Path(spec.origin).is_file():
        raise BuilderFailure(f"module {name!r} is not a Python source file")
    path = Path(spec.origin).resolve()
    os.chdir(path.parent)  # relative seed paths: from the module's directory, as for a script
    try:
        module = importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        raise _raised(exc, f"importing {name}", str(path)) from None
    return module, path


def _call(module: ModuleType, function: str, path: Path) -> tuple[Any, int | None]:
    """Call ``function`` of ``module`` as Data Designer's CLI calls ``load_config_builder``: with no argument, or
    with one ``DataDesignerScriptParams`` (no script arguments: ``argv`` is empty)."""
    func = getattr(module, function, None)
    if func is None:
        if function == DD_BUILDER_FUNCTION:
            raise BuilderFailure(
                f"does not define a '{DD_BUILDER_FUNCTION}()' function (Data Designer's convention for a Python "
                f"config); add: def {DD_BUILDER_FUNCTION}() -> DataDesignerConfigBuilder, or name another function "
                f"in the run file (recipe: {path.name}:FUNCTION)",
                str(path),
            )
        raise BuilderFailure(f"defines no function {function!r}", str(path))
    code = getattr(func, "__code__", None)
    line = code.co_firstlineno if code is not None and Path(code.co_filename).resolve() == path else None
    if not callable(func):
        raise BuilderFailure(f"{function!r} is not callable", str(path), line)
    from data_designer.config import DataDesignerScriptParams

    try:
        parameters = tuple(inspect.signature(func).parameters.values())
    except (TypeError, ValueError) as exc:
        raise BuilderFailure(f"cannot inspect {function}(): {exc}", str(path), line) from None
    unsupported = f"{function}() must take no argument or one DataDesignerScriptParams (as Data Designer requires)"
    if len(parameters) > 1:
        raise BuilderFailure(unsupported, str(path), line)
    params = DataDesignerScriptParams()
    try:
        if not parameters:
            return func(), line
        parameter = parameters[0]
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return func(params), line
        if parameter.kind == inspect.Parameter.KEYWORD_ONLY:
            return func(**{parameter.name: params}), line
    except (Exception, SystemExit) as exc:
        raise _raised(exc, f"{function}()", str(path), line) from None
    raise BuilderFailure(unsupported, str(path), line)


def _to_yaml(value: Any, function: str, path: Path, line: int | None) -> str:
    """The config as Data Designer writes it, in the config's own key order: ``builder.write_config("recipe.yaml",
    sort_keys=False)``, or ``to_yaml(sort_keys=False)`` of a config object (after the check ``write_config`` makes:
    an in-memory DataFrame seed cannot be written). Data Designer's default sorts every mapping's keys (PyYAML's
    ``sort_keys``): an output schema's fields, a judge's options, which are in the requests its columns send, would
    reach the node in another order than the builder's (:func:`~ddslurm.runtime._node_recipe.round_trip_changes`
    checks what the YAML still changes)."""
    import data_designer.config as dd
    from data_designer.config.config_builder import BuilderConfig

    try:
        if isinstance(value, dd.DataDesignerConfigBuilder):
            with tempfile.TemporaryDirectory(prefix="ddslurm-recipe-") as scratch:
                target = Path(scratch) / "recipe.yaml"
                value.write_config(target, sort_keys=False)
                return target.read_text(encoding="utf-8")
        if isinstance(value, dd.DataDesignerConfig):
            value = BuilderConfig(data_designer=value)
        if isinstance(value, BuilderConfig):
            seed = value.data_designer.seed_config
            if seed is not None and isinstance(seed.source, dd.DataFrameSeedSource):
                raise ValueError(
                    "the config has a DataFrame seed dataset, which cannot be written to a config file; save it "
                    "(LocalFileSeedSource.from_dataframe(df, 'seed.parquet')) and use that file"
                )
            return str(value.to_yaml(indent=2, sort_keys=False))  # no path: the YAML text
    except Exception as exc:
        raise BuilderFailure(
            f"{function}() returned a config that Data Designer cannot write: {type(exc).__name__}: {exc}",
            str(path),
            line,
        ) from None
    raise BuilderFailure(
        f"{function}() returned {type(value).__name__}, expected a DataDesignerConfigBuilder (or a Data Designer "
        "config: DataDesignerConfig, BuilderConfig)",
        str(path),
        line,
    )


PARALLEL_REQUESTS = "max_parallel_requests"


def only_chosen_parallel_requests(value: Any, text: str) -> str:
    """``text`` (the YAML Data Designer wrote for ``value``, a config a builder returned) without the
    ``max_parallel_requests`` of each model config whose script did not set it: Data Designer writes every field,
    its default of 4 included, and ddslurm sizes a deployed alias whose model config chose none
    (``ddslurm.config.sized_parallel_requests``), so that only a value the script gave, 4 as much as any other, is
    kept. Data Designer reads the config the same without it (the default). Data Designer's YAML is
    ``yaml.dump(config.to_dict(), sort_keys=False)`` in every supported version; the config written again the same
    way differs from it by those fields alone."""
    import yaml
    from data_designer.config.config_builder import BuilderConfig

    config = value.data_designer if isinstance(value, BuilderConfig) else value
    unset = set()
    for model in getattr(config, "model_configs", None) or []:
        chosen = getattr(model.inference_parameters, "model_fields_set", None)
        if chosen is not None and PARALLEL_REQUESTS not in chosen:
            unset.add(model.alias)
    if not unset:
        return text
    tree = yaml.safe_load(text)
    section = tree.get("data_designer", tree) if isinstance(tree, dict) else {}
    for entry in section.get("model_configs") or []:
        params = entry.get("inference_parameters")
        if entry.get("alias") in unset and isinstance(params, dict):
            params.pop(PARALLEL_REQUESTS, None)
    return str(yaml.dump(tree, indent=2, sort_keys=False))


def _as_data_designers_cli() -> None:
    """Import Data Designer's interface before the script, as its CLI has when it loads a config source, where a
    plugin is installed: a plugin whose module imports the engine loads then (in the other order Data Designer 0.9
    drops it, a circular import in its discovery). Without plugins the seconds of that import are saved."""
    if importlib.metadata.entry_points(group=PLUGIN_GROUP):
        import data_designer.config  # noqa: F401
        from data_designer.interface import DataDesigner  # noqa: F401


def call_builder(request: BuildRequest) -> tuple[Any, Path, int | None]:
    """Load the script (``script``) or module (``module``, looked for beside ``run_dir`` too) and call its
    ``function``: what it returned, the file and the function's line. :class:`BuilderFailure` says what went wrong,
    where. The working directory becomes the script's (module's) directory, as for Data Designer's CLI."""
    _as_data_designers_cli()
    if request.script is not None:
        path = Path(request.script)
        os.chdir(path.parent)
        module = _load_script(path)
    else:
        module, path = _import_module(str(request.module), request.run_dir)
    value, line = _call(module, request.function, path)
    return value, path, line


def build(request: BuildRequest) -> BuildAnswer:
    """Call the builder and serialise the config it returns as Data Designer does; ``rebuild`` names the columns
    whose config the YAML does not carry as it is, ``changes`` says what it changes in each; ``columns_at`` and
    ``models_at`` where the user's code made each column and model config (:func:`_made_at`)."""
    from ddslurm.runtime._node_recipe import round_trip_changes

    function = request.function
    given: list[GivenMCPProvider] = []
    columns_at: dict[str, CodeLine] = {}
    models_at: dict[str, CodeLine] = {}
    workflow: WorkflowShape | None = None
    try:
        with _mcp_providers_given(given, _may_create_data_designer(request)), _made_at(columns_at, models_at):
            value, path, line = call_builder(request)
        if is_workflow(value):
            workflow = shape(value)
            with _placed(function, path, line):
                value = stage_builder(value, request.stage or 0, request.seed)
        elif request.stage:
            raise BuilderFailure(f"{function}() no longer returns a workflow (its stages run one after another)")
        text = only_chosen_parallel_requests(value, _to_yaml(value, function, path, line))
    except BuilderFailure as failure:
        return BuildAnswer(ok=False, error=failure.message, file=failure.file, line=failure.line)
    changes = round_trip_changes(value, text)
    module = sys.modules.get(_module_name(path)) or sys.modules.get(str(request.module))
    given += _module_mcp_providers(module, given)
    return BuildAnswer(
        ok=True,
        yaml=text,
        file=str(path),
        line=line,
        rebuild=tuple(sorted(changes)),
        changes=changes,
        mcp_providers=tuple(given),
        workflow=workflow,
        columns_at=columns_at,
        models_at=models_at,
    )


@contextlib.contextmanager
def _placed(function: str, path: Path, line: int | None) -> Iterator[None]:
    """A :class:`BuilderFailure` about what the builder returned, placed at the builder function: ``function()
    returned workflow ...`` at ``path``:``line``."""
    try:
        yield
    except BuilderFailure as failure:
        raise BuilderFailure(f"{function}() {failure.message}", str(path), line) from None


def _user_line() -> CodeLine | None:
    """The deepest line of the user's own code on the stack now (the call being recorded), None when there is
    none."""
    frames = _own(traceback.extract_stack())
    return CodeLine(file=frames[-1].filename, line=frames[-1].lineno) if frames and frames[-1].lineno else None


@contextlib.contextmanager
def _made_at(columns: dict[str, CodeLine], models: dict[str, CodeLine]) -> Iterator[None]:
    """Record, while the builder is loaded and called, the line of the user's code that made each column (its
    ``DataDesignerConfigBuilder.add_column`` call, by the column's name) and each model config (its
    ``ModelConfig(...)``, by alias): a refusal of one can then name that line. A name made twice keeps the last
    (as the builder keeps the last column of a name). Data Designer's classes are as they were afterwards."""
    import data_designer.config as dd

    builder, model = dd.DataDesignerConfigBuilder, dd.ModelConfig
    add_column = builder.add_column
    own_init = model.__dict__.get("__init__")  # pydantic's inherited one unless ModelConfig defines its own
    model_init = model.__init__

    def recording_add_column(self: Any, *args: Any, **kwargs: Any) -> Any:
        added = add_column(self, *args, **kwargs)
        config = args[0] if args else kwargs.get("column_config")
        name = getattr(config, "name", None) if config is not None else kwargs.get("name")
        place = _user_line()
        if isinstance(name, str) and place is not None:
            columns[name] = place
        return added

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        model_init(self, *args, **kwargs)
        alias, place = getattr(self, "alias", None), _user_line()
        if isinstance(alias, str) and place is not None:
            models[alias] = place

    builder.add_column = recording_add_column
    model.__init__ = recording_init
    try:
        yield
    finally:
        builder.add_column = add_column
        if own_init is None:
            del model.__init__
        else:
            model.__init__ = own_init


def _is_mcp_provider(value: Any) -> bool:
    from data_designer.config.mcp import LocalStdioMCPProvider, MCPProvider

    return isinstance(value, MCPProvider | LocalStdioMCPProvider)


_DATA_DESIGNER = re.compile(rb"\bDataDesigner\b")


def _may_create_data_designer(request: BuildRequest) -> bool:
    """Whether the script names ``DataDesigner`` (a module: always assumed)."""
    if request.script is None:
        return True
    try:
        return _DATA_DESIGNER.search(Path(request.script).read_bytes()) is not None
    except OSError:
        return True


@contextlib.contextmanager
def _mcp_providers_given(given: list[GivenMCPProvider], watch: bool = True) -> Iterator[None]:
    """Record in ``given`` the MCP providers the script passes to ``DataDesigner(mcp_providers=...)`` while it is
    loaded and called (:class:`~ddslurm.config.GivenMCPProvider`: its fields, where in the user's code); Data
    Designer reads no ``mcp_providers.yaml`` then, so these are the ones its tools use. Not ``watch``: a script
    that never names ``DataDesigner`` is spared importing its interface (seconds)."""
    if not watch:
        yield
        return
    from data_designer.interface import DataDesigner

    original = DataDesigner.__init__

    def recording(designer: Any, *args: Any, **kwargs: Any) -> None:
        frames = _own(traceback.extract_stack())
        line = frames[-1].lineno if frames else None
        for provider in kwargs.get("mcp_providers") or ():
            given.append(GivenMCPProvider(provider=provider.model_dump(mode="json"), line=line))
        original(designer, *args, **kwargs)

    DataDesigner.__init__ = recording
    try:
        yield
    finally:
        DataDesigner.__init__ = original


def _module_mcp_providers(module: ModuleType | None, given: list[GivenMCPProvider]) -> list[GivenMCPProvider]:
    """The MCP providers the script's module holds at its top level (alone, or in a list or tuple), for the
    ``DataDesigner(mcp_providers=...)`` of its ``if __name__ == "__main__":`` block, which loading does not run;
    those already given to a ``DataDesigner`` are left out."""
    if module is None:
        return []
    seen = {p.provider["name"] for p in given}
    found = []
    for value in list(vars(module).values()):
        for item in value if isinstance(value, list | tuple) else (value,):
            if _is_mcp_provider(item) and item.name not in seen:
                seen.add(item.name)
                found.append(GivenMCPProvider(provider=item.model_dump(mode="json")))
    return found


def rebuilt_columns(source: RecipeSource, names: Iterable[str]) -> dict[str, Any]:
    """The column configs ``names`` as the builder returns them on this node: the run's copy of the script is run
    (as the script's own path, from its directory when the node has it) or the module imported from
    ``python_env``. :class:`RecipeError` when it fails or lacks one of the columns."""
    from ddslurm.runtime._node_recipe import config_columns

    wanted = set(names)
    origin = Path(source.origin)
    _as_data_designers_cli()
    function = source.builder.rsplit(":", 1)[1]
    cwd = Path.cwd()
    try:
        if source.module is not None:
            module, path = _import_module(source.module, str(origin.parent))
        else:
            if origin.parent.is_dir():
                os.chdir(origin.parent)
            module, path = _load_script(origin, Path(source.file)), origin
        value, line = _call(module, function, path)
        if source.stage is not None:  # a workflow's stage: its columns are the stage builder's
            with _placed(function, path, line):
                value = stage_of(value, source.stage).config_builder
        columns = {c.name: c for c in config_columns(value) if c.name in wanted}
    except BuilderFailure as failure:
        where = f"{failure.file}:{failure.line}" if failure.line else (failure.file or source.builder)
        message = f"{where}: the builder, run on the node for columns {sorted(wanted)}: {failure.message}"
        raise RecipeError(message) from None
    except Exception as exc:
        raise RecipeError(f"{source.builder}: the config it returned on the node cannot be read: {exc}") from exc
    finally:
        os.chdir(cwd)
    missing = sorted(wanted - columns.keys())
    if missing:
        raise RecipeError(f"{source.builder}: on the node its config has no column {missing[0]!r} (it had at submit)")
    return columns
