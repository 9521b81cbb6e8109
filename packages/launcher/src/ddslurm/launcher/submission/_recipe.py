"""A run's recipe, loaded on the submit host: a Data Designer config file, or Python that builds one.

``recipe: recipe.yaml`` (or ``.json``) is a config as ``DataDesignerConfigBuilder.write_config`` writes it.
``recipe: build.py`` is a builder script in Data Designer's own convention: ``data-designer create build.py``
loads a ``.py`` config source from its file, with the file's directory first on ``sys.path``, and calls its
``load_config_builder()`` (no argument, or one ``DataDesignerScriptParams``), which returns a
``DataDesignerConfigBuilder`` (``data_designer/cli/utils/config_loader.py``, ``_load_from_python_module``).
ddslurm loads the script the same way, so a script that works with Data Designer's CLI works here.
``recipe: build.py:make`` calls ``make`` instead, and ``recipe: package.module:make`` imports an installed module
(or one beside the run file); such a function may also return a Data Designer config object
(``DataDesignerConfig`` or ``BuilderConfig``).

The Python runs in the profile's ``python_env`` (``<python_env>/bin/ddslurm-runtime inspect``'s ``build``, asked
through the engine host, :mod:`ddslurm.launcher.cluster._engine_host`: the Data Designer, plugins and packages the nodes
run), never in the submitting process:

- its working directory is the script's directory: Data Designer checks a relative seed path against the
  working directory, and the seed capture (``_seed.py``) resolves it against the script's directory, as it does
  against a YAML recipe's;
- it has a timeout, and what it prints is captured and shown only when it fails, every secret value of the
  submitting shell redacted (the values of :func:`secret_names`, ``providers.redact``);
- its environment (:func:`script_environment`, the same for its second run in Data Designer's check,
  ``_validate.py``) has none of the shell's secrets: the API-key variables of Data Designer's providers and MCP
  providers (``${VAR}`` names included), the deployments' ``server.env_from`` variables, and every variable whose
  name or value looks like a credential. That is hygiene, not a barrier: the script is the user's own code, run as
  the user, and can read whatever the user's shell holds (``/proc/$PPID/environ``, the user's files);
- Data Designer's home is the one ddslurm resolves providers from, telemetry is off; plugins are on, as on the
  nodes.

Its result is serialised by Data Designer itself (``write_config``; ``BuilderConfig.to_yaml`` for a config
object) in the config's own key order, as ``builder.write_config("recipe.yaml", sort_keys=False)`` would write it
(Data Designer's default sorts an output schema's fields, which are in the prompt it sends), less each model config's
``max_parallel_requests`` that the script did not set (``only_chosen_parallel_requests``); the seed capture
(``_seed.py``) then points its seed at the run's copy, as for a config file, and the nodes run that config. The
script is kept beside it as ``inputs/recipe-source.py``, its sha256 in the plan (``Plan.recipe_source``). Columns
that the YAML does not carry as they are (a custom column's function, a plugin field left out of the YAML, a judge's
integer option keys; every field is compared as the requests the column sends, an output schema's field order
included) are named in ``RecipeSource.rebuild``: the node takes them from running that copy of the script
(``ddslurm.runtime._builder``), so their types survive; the submit says which and why (:attr:`LoadedRecipe.changes`,
``RecipeSource.reasons``).

Whatever the recipe's kind, its text is checked for the run's secrets by one function (:func:`refuse_secrets`):
a config file's text (YAML or JSON, comments included) and the config a builder returned alike, and so are the run
file and the seed files it names (``_seed.refuse_seed_secrets``), before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import (
    DD_BUILDER_FUNCTION,
    MAX_YAML_BYTES,
    BuildAnswer,
    BuildRequest,
    ConfigError,
    ConfigFileError,
    RecipeRef,
    RecipeSource,
    RunFile,
    RunLayout,
    WorkflowShape,
    WorkflowStage,
    locate,
    parse_recipe_ref,
    read_text_file,
    read_yaml,
    recipe_section,
    sha256_bytes,
    to_builtins,
)
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._process import Stopped
from ddslurm.launcher.cluster._slurm import NODE_ENV_ALLOWED
from ddslurm.launcher.errors import BuilderError, InspectAnswerError
from ddslurm.launcher.submission._seed import refuse_seed_secrets
from ddslurm.providers import (
    Origin,
    ProvidersError,
    holds_secret,
    load_recipe,
    load_settings,
    redact,
    secret_in_tree,
    secret_values,
    settings_secret_names,
)
from ddslurm.providers import secret_names as env_secret_names
from ddslurm.providers.discovery import DD_HOME_ENV

RECIPE_TIMEOUT_S = 300.0
"""How long a builder script may take to return its config."""
OUTPUT_LINES = 30
"""Lines of a failed script's output shown in the error."""
KEPT_ENV = (*NODE_ENV_ALLOWED, "PYTHONPATH", "VIRTUAL_ENV")
"""Variables the builder always gets as they are (never taken for credentials)."""


@dataclass(frozen=True, slots=True)
class StageRequest:
    """Which stage of a workflow to load (``ddslurm workflow``): stage ``index`` (from 1: the first is what a plain
    ``submit`` loads), seeded from the dataset of ``previous`` (the run of the stage before), which holds ``rows``."""

    index: int
    previous: RunLayout
    rows: int
    stages: tuple[str, ...]
    """The workflow's stage names as its first stage's run recorded them: the builder must still return them."""


@dataclass(frozen=True, slots=True)
class LoadedWorkflow:
    """A builder returned a Data Designer workflow: its name, its stages, and which of them was loaded."""

    name: str
    stages: tuple[WorkflowStage, ...]
    index: int


@dataclass(frozen=True, slots=True)
class LoadedRecipe:
    """A run's recipe as plain data, and what the run's inputs store of it."""

    ref: RecipeRef
    path: Path
    """The recipe file: the config file, or the builder script (a module's file). Relative seed paths in the
    recipe are relative to its directory."""
    origin: Path
    """How errors about the recipe's content name it: the config file, or ``build.py:load_config_builder()``."""
    data: dict[str, Any]
    stored: bytes
    """What ``inputs/recipe.yaml`` holds (before the seed capture points it at the copied seed)."""
    source: bytes | None = None
    """The builder script's source, kept as ``inputs/recipe-source.py``; None for config files."""
    builder: str | None = None
    """What was called, ``/abs/build.py:load_config_builder`` or ``package.module:function``."""
    changes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The builder's columns that Data Designer's YAML round trip changes, each with what it changes: the node
    takes them from the script."""
    mcp_providers: tuple[tuple[Mapping[str, Any], int | None], ...] = ()
    """The MCP providers the script gives ``DataDesigner(mcp_providers=...)`` (or holds at its top level), each
    with the script's line that does: Data Designer's fields, a key as the script wrote it."""
    workflow: LoadedWorkflow | None = None
    """The builder returned a Data Designer workflow: :attr:`data` is the config of its stage ``workflow.index``."""
    columns_at: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Where the builder's code made each column, by name (``/abs/build.py:27``: its ``add_column`` call)."""
    models_at: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Where the builder's code made each model config, by alias (its ``ModelConfig(...)``)."""

    def content_origin(self) -> Origin:
        """How errors about the recipe's content name it (:attr:`origin`), each column and model config of a
        builder's config placed at the line that made it (``Origin.placed``)."""
        section = recipe_section(self.data)
        steps: tuple[str, ...] = ("data_designer",) if section is not self.data else ()
        placed: list[tuple[tuple[str | int, ...], str]] = []
        for key, field, made in (("columns", "name", self.columns_at), ("model_configs", "alias", self.models_at)):
            entries = section.get(key)
            for index, entry in enumerate(entries if isinstance(entries, list) else []):
                name = entry.get(field) if isinstance(entry, Mapping) else None
                where = made.get(name) if isinstance(name, str) else None
                if where is not None:
                    placed.append(((*steps, key, index), where))
        return Origin(self.origin, placed=tuple(placed))

    def given_mcp_providers(self) -> list[tuple[Mapping[str, Any], Origin]]:
        """:attr:`mcp_providers`, placed in the script (for ``providers.with_given_mcp_providers``)."""
        return [(fields, Origin(self.path, line)) for fields, line in self.mcp_providers]

    def source_record(self, layout: RunLayout) -> RecipeSource | None:
        """The plan's record of the builder script (None for config files)."""
        if self.source is None or self.builder is None:
            return None
        return RecipeSource(
            file=str(layout.recipe_source),
            sha256=sha256_bytes(self.source),
            builder=self.builder,
            origin=str(self.path),
            module=self.ref.target if self.ref.kind == "module" else None,
            rebuild=tuple(sorted(self.changes)),
            reasons=tuple(f"{name!r}: {self.changes[name]}" for name in sorted(self.changes)),
            stage=None if self.workflow is None else self.workflow.index,
        )


def _at_recipe(run_path: Path, message: str) -> ConfigFileError:
    try:
        line, col = locate(read_yaml(run_path), ["recipe"])
    except ConfigError:
        line, col = None, None
    return ConfigFileError(run_path, message, line=line, col=col, field="recipe")


def load_run_recipe(
    run: RunFile,
    run_path: Path,
    env: Mapping[str, str],
    dd_home: Path,
    *,
    runtime: Path | None,
    host: EngineHost = RUNTIME_PROCESS,
    timeout_s: float = RECIPE_TIMEOUT_S,
    stage: StageRequest | None = None,
    run_text: str | None = None,
) -> LoadedRecipe:
    """The recipe ``run`` names (relative to ``run_path``): a config file is read; a builder script or
    ``module:function`` is run by ``runtime`` (``<python_env>/bin/ddslurm-runtime``, asked through ``host``; see
    the module's docstring) with Data Designer's home ``dd_home`` and the secrets of ``env`` left out (``runtime``
    None: no profile names a ``python_env``, and a recipe built by Python is refused at the run file's
    ``recipe``). Missing files are :class:`ConfigFileError` at the run file's ``recipe``; a script that fails,
    raises or returns something else is :class:`BuilderError` naming the script and line.

    The run file, the recipe (a config file's text, or the config a script returned, and the script) and the seed
    files it names are refused (:class:`BuilderError`, :class:`SubmitError` for seed files) when they hold the value
    of one of the run's secrets (:func:`secret_names`' values), by one check for every kind of recipe
    (:func:`refuse_secrets`; the seed files: ``refuse_seed_secrets``).

    A builder that returns a Data Designer workflow gives the config of its first stage, or of ``stage``'s, seeded
    from the dataset of the stage before (:class:`LoadedRecipe.workflow`, ``ddslurm.runtime._workflow``).
    ``run_text``: the run file's text as ``submit`` read it (read here when not given)."""
    try:
        ref = parse_recipe_ref(run.recipe)
    except ValueError as exc:
        raise _at_recipe(run_path, str(exc)) from None
    base = run_path.parent.resolve()
    hidden = secret_names(run, env, dd_home)  # read once: the builder's environment and the values refused
    secrets = secret_values(hidden, env)
    if run_text is None:
        run_text = read_text_file(run_path)
    refuse_secrets(run_text, read_yaml(run_path, text=run_text), secrets, origin=run_path, subject="the run file")
    if ref.kind == "config":
        path = (base / ref.target).resolve()
        if not path.is_file():
            hint = ""
            dotted = all(part.isidentifier() for part in ref.target.split(".")) and "." in ref.target
            if dotted and Path(ref.target).suffix.lower() not in (".yaml", ".yml", ".json"):
                hint = f" (a module's function is written {ref.target}:function)"
            raise _at_recipe(run_path, f"{path} does not exist{hint}")
        text = read_text_file(path, MAX_YAML_BYTES)  # read once: what is checked is what the run stores
        data = load_recipe(path, text=text)
        refuse_secrets(text, read_yaml(path, text=text), secrets, origin=path, subject="the recipe")
        refuse_seed_secrets(data, path, secrets)
        return LoadedRecipe(ref=ref, path=path, origin=path, data=data, stored=text.encode("utf-8"))
    if runtime is None:
        raise _at_recipe(
            run_path,
            f"{ref} is built by Python, which runs in the cluster profile's python_env as submit runs it: give "
            "--profile PROFILE.yaml (or DDSLURM_PROFILE naming it)",
        )
    function = ref.function or DD_BUILDER_FUNCTION
    request = BuildRequest(
        function=function,
        run_dir=str(base),
        stage=None if stage is None else stage.index,
        seed=None if stage is None else str(stage.previous.dataset),
    )
    if ref.kind == "script":
        script = (base / ref.target).resolve()
        if not script.is_file():
            raise _at_recipe(run_path, f"{script} does not exist (a builder script, relative to the run file)")
        request = msgspec.structs.replace(request, script=str(script))
        cwd, shown = script.parent, str(script)
    else:
        request = msgspec.structs.replace(request, module=ref.target)
        cwd, shown = base, f"module {ref.target}"
    scrubbed = builder_env(script_environment(env, hidden), dd_home)
    result, output = _run_builder(host, runtime, request, cwd, scrubbed, timeout_s)
    if not result.ok:
        where = result.file or shown
        if result.line:
            where = f"{where}:{result.line}"
        message = f"{where}: {result.error or 'failed'}"
        raise BuilderError(redact(message + _output_tail(output), secrets))
    path = Path(str(result.file))
    text = result.yaml
    source = path.read_bytes()
    builder = f"{path}:{function}" if ref.kind == "script" else str(ref)
    tree = read_yaml(path, text=text)  # the same limits as any YAML a user gives
    # the config first: it is what the nodes run and what a key read from elsewhere reaches
    refuse_secrets(text, tree, secrets, origin=path, subject=f"the config that {function}() returned", lines=False)
    for name, value in sorted(secrets.items()):
        if value.encode() in source:
            raise BuilderError(
                f"{path}: the script {holds_secret(name)}; ddslurm keeps a copy of the script in the run's inputs: "
                "remove the key from it"
            )
    data = to_builtins(tree)
    if not isinstance(data, dict):
        raise BuilderError(f"{path}: {function}() did not produce a Data Designer config (not a mapping)")
    refuse_seed_secrets(data, path, secrets)
    origin = Path(f"{path}:{function}()")  # names the recipe in errors about its content; never opened as YAML
    given = tuple((p.provider, p.line) for p in result.mcp_providers)
    workflow = _workflow(result.workflow, stage, f"{path}:{result.line or 1}: {function}()")
    return LoadedRecipe(
        ref=ref,
        path=path,
        origin=origin,
        data=data,
        stored=text.encode(),
        source=source,
        builder=builder,
        changes=result.changes,
        mcp_providers=given,
        workflow=workflow,
        columns_at={name: str(at) for name, at in result.columns_at.items()},
        models_at={alias: str(at) for alias, at in result.models_at.items()},
    )


def _workflow(shape: WorkflowShape | None, stage: StageRequest | None, where: str) -> LoadedWorkflow | None:
    """The workflow a builder returned (``shape``: the build's ``workflow``), checked against ``stage``'s: the
    stages a later stage is loaded from are those the first stage's run recorded."""
    if shape is None:
        return None
    names = tuple(s.name for s in shape.stages)
    if stage is not None and names != stage.stages:
        raise BuilderError(
            f"{where} now returns workflow {shape.name!r} with stages {list(names)}, where its first stage's run "
            f"was submitted with {list(stage.stages)}: a workflow's stages cannot change between its runs (submit "
            "it again from its first stage)"
        )
    return LoadedWorkflow(name=shape.name, stages=shape.stages, index=0 if stage is None else stage.index)


def refuse_secrets(
    text: str, tree: Any, secrets: Mapping[str, str], *, origin: Path, subject: str, lines: bool = True
) -> None:
    """Refuse (:class:`BuilderError`) a recipe that holds the value of one of ``secrets``: a config file's text
    (YAML or JSON) and the config a builder script returned alike, ``tree`` being ``text`` parsed by ruamel.

    Every string of the tree is searched (keys and values at any depth: a JSON string escaped in the file is found
    decoded), then the text itself (a comment, which ``inputs/recipe.yaml`` keeps). The error names
    ``origin``, the line and column in it where ``lines`` (a file the user wrote; not a config serialised from a
    builder) and the field (``data_designer.columns[1].prompt``), never the value."""
    hit = secret_in_tree(tree, secrets)
    line: int | None = None
    col: int | None = None
    if hit is not None:
        name, field = hit.name, hit.field
        if lines:
            line, col = locate(tree, list(hit.steps))
    else:
        offsets = sorted((text.find(value), name) for name, value in secrets.items() if value and value in text)
        if not offsets:
            return
        offset, name = offsets[0]
        field = ""
        if lines:
            line, col = text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)
    where = str(origin) if line is None else f"{origin}:{line}:{col}"
    where += f": {field}" if field else ""
    raise BuilderError(
        f"{where}: {subject} {holds_secret(name)}; the run's inputs would keep a copy: remove the key (a provider's "
        "api_key names the variable that holds it, read on the node)"
    )


def secret_names(run: RunFile | None, env: Mapping[str, str], dd_home: Path) -> set[str]:
    """The variables of ``env`` a process of the submit host must not see (a builder script, ``python_env`` asked
    its versions): the API-key variables of Data Designer's providers and MCP providers (``dd_home``; an MCP
    stdio server's ``${VAR}`` names too), the deployments' ``server.env_from`` (``run``'s, when there is one), and
    any whose name or value looks like a credential (``providers.secret_names``). An absolute path is never a
    credential by its variable's name (``PWD``, ``SSH_AUTH_SOCK``, ``GOOGLE_APPLICATION_CREDENTIALS``): a recipe
    may name files under the working directory."""
    names = {name for dep in (run.deployments if run is not None else ()) for name in dep.server.env_from}
    try:
        settings = load_settings(dd_home)
    except (ConfigError, ProvidersError):
        settings = None  # submit reports it right after; the heuristics still apply
    if settings is not None:
        names |= settings_secret_names(settings)
    return env_secret_names(env, names, kept=KEPT_ENV)


def script_environment(env: Mapping[str, str], hidden: Collection[str]) -> dict[str, str]:
    """The environment every run of a builder script on the submit host starts from: the run that builds the
    config (:func:`load_run_recipe`) and the one in Data Designer's check, which runs it again for the columns the
    YAML does not carry (``_validate.dd_check_recipe``). ``env`` without the variables ``hidden`` names
    (:func:`secret_names`, and for the second run the snapshot's key variables, known once the config is built),
    Python told to write no bytecode beside the
    script; each run then points Data Designer at its home. This is hygiene, not a barrier: the script is the
    user's own code, run as the user, and can read what the user's shell holds (``/proc/$PPID/environ``)."""
    return {name: value for name, value in env.items() if name not in hidden} | {"PYTHONDONTWRITEBYTECODE": "1"}


def builder_env(base: Mapping[str, str], dd_home: Path) -> dict[str, str]:
    """The builder subprocess's environment: ``base`` (:func:`script_environment`) with Data Designer's home set to
    ``dd_home`` (where ddslurm reads the providers and Data Designer its default model configs), telemetry off."""
    return {**base, DD_HOME_ENV: str(dd_home), "NEMO_TELEMETRY_ENABLED": "false"}


def _output_tail(output: str) -> str:
    lines = output.rstrip().splitlines()
    if not lines:
        return ""
    shown = lines[-OUTPUT_LINES:]
    head = f"last {len(shown)} of {len(lines)} lines" if len(lines) > len(shown) else f"{len(lines)} lines"
    return f"\n  output of the script ({head}):\n" + "\n".join(f"    {line}" for line in shown)


def _run_builder(
    host: EngineHost, runtime: Path, request: BuildRequest, cwd: Path, env: dict[str, str], timeout_s: float
) -> tuple[BuildAnswer, str]:
    """What the builder answered (a failure to ask it is a failed build too), and what it printed."""
    try:
        answered = host.ask(runtime, request, timeout_s=timeout_s, env=env, cwd=cwd)
    except Stopped as stopped:
        error = f"{request.function}() did not return a config within {timeout_s:g} s and was stopped"
        return BuildAnswer(ok=False, error=error), stopped.stderr
    except OSError as exc:
        return BuildAnswer(ok=False, error=f"cannot run {runtime} (the profile's python_env): {exc}"), ""
    except InspectAnswerError as exc:
        if exc.answered:
            return BuildAnswer(ok=False, error=str(exc)), exc.stderr
        error = f"running {request.function}() ended without a result (exit code {exc.returncode}); see its output"
        return BuildAnswer(ok=False, error=error, file=request.script), exc.stderr
    return answered.answer, answered.stderr
