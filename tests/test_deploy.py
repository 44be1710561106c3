"""The deployment files, checked by parsing them: no container engine runs here.

docker-compose.yml, Dockerfile, .dockerignore, deploy/aerospike.conf and the
README sections that describe them must agree: the services exist, every file
they name is in the repository, the Aerospike namespace can take TTL writes,
the published ports are the documented ones, the commands only use aeroqueue
subcommands and options that exist, and no secret is written down.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from aeroqueue.config import parse_url
from aeroqueue.worker import load_handler

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
AEROSPIKE_CONF = ROOT / "deploy" / "aerospike.conf"
README = ROOT / "README.md"
DEPLOY_README = ROOT / "deploy" / "README.md"

SERVICES = {"aerospike", "mysql", "spark-master", "spark-worker", "aeroqueue-init", "aeroqueue-worker", "aeroqueue-sync",
            "aeroqueue-metrics"}
# Host port -> the service that publishes it (the README's "Deploying" section lists them).
PORTS = {3000: "aerospike", 3306: "mysql", 8080: "spark-master", 7077: "spark-master", 9420: "aeroqueue-metrics"}
STORE_URL = "aerospike://aerospike:3000/test"
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|PWD|SECRET|TOKEN|API_KEY", re.I)
SPARK_CLASSES = {"org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"}


# -- helpers (each has a test below showing it catches what it is for) ---------------


_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable interpolation: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?error}, ${VAR?error}. A required variable that is missing raises KeyError."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = env.get(name)
        if op in (":-", ":?") and not value:
            value = None
        if value is not None:
            return value
        if op in (":-", "-"):
            return arg
        if op in (":?", "?"):
            raise KeyError(f"{name}: {arg}")
        return ""

    return _VAR.sub(sub, text)


def compose_text_values(node: Any) -> Iterator[str]:
    """Every string (keys included) in a parsed YAML document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for k, v in node.items():
            yield from compose_text_values(k)
            yield from compose_text_values(v)
    elif isinstance(node, list):
        for v in node:
            yield from compose_text_values(v)


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def secret_literals(doc: Mapping[str, Any], raw: str) -> list[str]:
    """Places where a secret is written down instead of named: a secret-named
    variable set to anything but a required ${VAR} reference, a default value for
    a secret variable, a password inside a URL, or a password option with a value."""
    found = []
    for name, service in (doc.get("services") or {}).items():
        for key, value in environment(service).items():
            if not SECRET_NAME.search(key) or re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*(:?\?[^}]*)?\}", value):
                continue
            if "RANDOM" in key.upper() and value.lower() in ("yes", "true", "1"):
                continue  # a switch that makes the service generate the secret itself
            found.append(f"{name}: environment {key}={value!r} is not a ${{VAR}} reference")
    for m in re.finditer(r"\$\{([A-Za-z0-9_]+)(:?-)[^}]*\}", raw):
        if SECRET_NAME.search(m.group(1)):
            found.append(f"{m.group(0)!r}: a secret must not have a default value")
    for text in compose_text_values(doc):
        # A ${VAR} inside a URL's password still lands on a command line (and in ps).
        bare = re.sub(r"\$\{[^}]*\}", "VAR", text)
        for _ in re.finditer(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:([^@\s/]+)@", bare):
            found.append(f"{text!r}: a password inside a URL")
        for m in re.finditer(r"(?:--password|--pass)(?:=|\s+)(\S+)", text):
            if not m.group(1).lstrip("\"'").startswith("$"):
                found.append(f"{text!r}: a password on a command line")
        for m in re.finditer(r"\b([A-Z_]*(?:PASSWORD|PWD)[A-Z_]*)=(\S+)", text):
            if not m.group(2).lstrip("\"'").startswith("$"):
                found.append(f"{text!r}: {m.group(1)} set to a literal")
    return found


def published_ports(service: Mapping[str, Any]) -> set[int]:
    """Host ports a service publishes (short and long syntax; ranges expanded)."""
    out: set[int] = set()
    for spec in service.get("ports") or []:
        if isinstance(spec, Mapping):
            if spec.get("published") is not None:
                out.update(_port_range(str(spec["published"])))
            continue
        text = str(spec).split("/")[0]
        parts = text.rsplit(":", 2)
        if len(parts) >= 2:  # [ip:]host:container; a bare container port publishes no fixed host port
            out.update(_port_range(parts[-2]))
    return out


def _port_range(text: str) -> range:
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def parse_aerospike_conf(text: str) -> dict[str, Any]:
    """aerospike.conf as nested dicts: contexts keyed by their header ("namespace test"),
    parameters by name, each a list of its values (a parameter may repeat)."""
    root: dict[str, Any] = {}
    stack = [root]
    tokens = re.sub(r"#[^\n]*", "", text).replace("{", " { ").replace("}", "\n}\n")
    for line in tokens.splitlines():
        words = line.split()
        while words:
            if "{" in words:
                i = words.index("{")
                header = " ".join(words[:i])
                if not header:
                    raise ValueError(f"a context without a name: {line!r}")
                ctx: dict[str, Any] = {}
                stack[-1][header] = ctx
                stack.append(ctx)
                words = words[i + 1:]
            elif words[0] == "}":
                if len(stack) == 1:
                    raise ValueError("unbalanced '}'")
                stack.pop()
                words = words[1:]
            else:
                stack[-1].setdefault(words[0], []).append(" ".join(words[1:]))
                words = []
    if len(stack) != 1:
        raise ValueError("unbalanced '{'")
    return root


def size_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)", text.strip().upper())
    if not m:
        raise ValueError(f"not a size: {text!r}")
    return int(m.group(1)) << (10 * "_KMGT".index(m.group(2) or "_"))


def duration_s(text: str) -> float:
    """A compose duration (1m30s, 45s, 500ms) or a bare number of seconds."""
    text = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    return sum(float(n) * unit[u] for n, u in parts)


def command_argv(command: Any) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def invocations(command: Any) -> list[list[str]]:
    """The programs a command runs: itself, or each step of an `sh -c` script."""
    argv = command_argv(command)
    if len(argv) >= 3 and PurePosixPath(argv[0]).name in ("sh", "bash") and argv[1] == "-c":
        return [shlex.split(step) for step in re.split(r"&&|\|\||;|\n", argv[2]) if step.strip()]
    return [argv]


def cli_problems(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """What is wrong with an `aeroqueue ...` command line, checked against the real
    click commands (aeroqueue.cli.main): unknown subcommands or options, missing
    arguments, required options given neither on the line nor by their env var."""
    from aeroqueue.cli import main

    assert argv[0] == "aeroqueue"
    cmd: click.Command = main
    args, i, path = argv[1:], 0, ["aeroqueue"]
    while True:
        options = {o: p for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
        given: set[str] = set()
        positionals = 0
        while i < len(args) and (args[i].startswith("-") or not isinstance(cmd, click.Group)):
            token = args[i]
            i += 1
            if not token.startswith("-") or token == "-":
                positionals += 1
                continue
            name, has_value, _ = token.partition("=")
            if name in ("-h", "--help", "--version"):
                return []  # an eager option: the command prints and exits
            opt = options.get(name)
            if opt is None:
                return [f"`{' '.join(path)}` has no option {name} (it has {', '.join(sorted(options))})"]
            given.add(opt.name or name)
            if not (opt.is_flag or opt.count or has_value):
                i += 1
        problems = [
            f"`{' '.join(path)}` needs {p.opts[0]} (or {p.envvar})"
            for p in cmd.params
            if isinstance(p, click.Option) and p.required and p.name not in given
            and not (isinstance(p.envvar, str) and env.get(p.envvar))
        ]
        if not isinstance(cmd, click.Group):
            needed = [p for p in cmd.params if isinstance(p, click.Argument) and p.required]
            if positionals < len(needed):
                problems.append(f"`{' '.join(path)}` needs {' '.join(p.human_readable_name for p in needed)}")
            return problems
        if problems:
            return problems
        if i >= len(args):
            return [f"`{' '.join(path)}` is given no subcommand"]
        sub = cmd.commands.get(args[i])
        if sub is None:
            return [f"`{' '.join(path)} {args[i]}`: aeroqueue has no such subcommand (it has {', '.join(sorted(cmd.commands))})"]
        path.append(args[i])
        cmd, i = sub, i + 1


def option_value(argv: list[str], name: str) -> str | None:
    for i, token in enumerate(argv):
        if token == name and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore (simple patterns, no negation) drops a path from the context."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(fnmatch.fnmatch(p, pat.strip("/")) or fnmatch.fnmatch(p, pat.removeprefix("**/")) for pat in patterns for p in prefixes)


def readme_section(text: str, title: str) -> str | None:
    """The body of the Markdown section whose heading starts with `title` (up to the
    next heading of the same or a higher level)."""
    m = re.search(rf"^(#+)\s+{re.escape(title)}\b.*$", text, re.M)
    if not m:
        return None
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}}\s", re.M).search(text, m.end())
    return text[m.end(): end.start() if end else len(text)]


def mentions_port(text: str, port: int) -> bool:
    return re.search(rf"(?<![\d.]){port}(?![\d.])", text) is not None


# -- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw() -> str:
    return COMPOSE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def compose(raw: str) -> dict[str, Any]:
    doc = yaml.safe_load(raw)
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), "docker-compose.yml has no services mapping"
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


@pytest.fixture(scope="module")
def conf() -> dict[str, Any]:
    return parse_aerospike_conf(AEROSPIKE_CONF.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))


def built_here(service: Mapping[str, Any]) -> bool:
    build = service.get("build")
    context = build if isinstance(build, str) else (build or {}).get("context")
    return context is not None and (COMPOSE.parent / context).resolve() == ROOT


def aeroqueue_services(services: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if built_here(s)}


# Values for the variables compose requires, so that commands can be interpolated.
REQUIRED_ENV = {"MYSQL_PASSWORD": "<from the environment>"}


# -- the compose file ------------------------------------------------------------


def test_compose_parses_and_has_the_services(services: dict[str, Any]) -> None:
    missing = SERVICES - set(services)
    assert not missing, f"docker-compose.yml lacks services {sorted(missing)}"
    for name, service in services.items():
        assert service.get("image") or service.get("build"), f"{name}: neither image nor build"


def test_every_referenced_file_exists(compose: dict[str, Any], services: dict[str, Any]) -> None:
    base = COMPOSE.parent
    declared_volumes = set(compose.get("volumes") or {})
    problems = []
    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            context = base / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = context / ((build.get("dockerfile") if isinstance(build, dict) else None) or "Dockerfile")
            if not context.is_dir():
                problems.append(f"{name}: build context {context} is not a directory")
            if not dockerfile.is_file():
                problems.append(f"{name}: Dockerfile {dockerfile} does not exist")
        for volume in service.get("volumes") or []:
            if isinstance(volume, Mapping):
                kind, source = volume.get("type"), str(volume.get("source", ""))
            else:
                source = str(volume).split(":")[0]
                kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            if kind == "bind" and not (base / source).exists():
                problems.append(f"{name}: mounts {source}, which is not in the repository")
            if kind == "volume" and source and source not in declared_volumes:
                problems.append(f"{name}: named volume {source} is not declared under volumes:")
        env_files = service.get("env_file") or []
        for entry in [env_files] if isinstance(env_files, str) else env_files:
            path = entry if isinstance(entry, str) else entry.get("path")
            required = True if isinstance(entry, str) else entry.get("required", True)
            if required and not (base / path).is_file():
                problems.append(f"{name}: env_file {path} does not exist")
    for kind in ("configs", "secrets"):
        for item, spec in (compose.get(kind) or {}).items():
            if isinstance(spec, Mapping) and spec.get("file") and not (base / spec["file"]).exists():
                problems.append(f"{kind}.{item}: file {spec['file']} does not exist")
    assert not problems, "\n".join(problems)


def test_images_are_pinned(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if service.get("build"):
            continue
        image = service["image"]
        tag = image.rpartition(":")[2] if ":" in image.split("/")[-1] else ""
        assert tag and tag != "latest" and re.match(r"\d", tag), f"{name}: image {image!r} is not pinned to a version"
    assert services["aerospike"]["image"].startswith("aerospike/aerospike-server:8.")  # Community Edition 8.x
    assert services["mysql"]["image"].startswith("mysql:8.")


def test_dependencies_wait_until_ready(services: dict[str, Any]) -> None:
    for name in ("aerospike", "mysql", "spark-master"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name, service in services.items():
        deps = service.get("depends_on") or {}
        assert isinstance(deps, Mapping), f"{name}: depends_on must use the long form with conditions"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on {dep}, which is not a service"
            condition = (spec or {}).get("condition", "service_started")
            if services[dep].get("healthcheck"):
                assert condition == "service_healthy", f"{name} must wait for {dep} to be healthy, not {condition}"
    for name in ("aeroqueue-worker", "aeroqueue-sync"):
        assert services[name]["depends_on"]["aeroqueue-init"]["condition"] == "service_completed_successfully", (
            f"{name} must start after the UDF modules are registered"
        )
    assert services["aeroqueue-init"].get("restart", "no") == "no", "aeroqueue-init is one-shot"
    for name in ("aeroqueue-init", "aeroqueue-worker", "aeroqueue-sync"):
        assert "aerospike" in services[name]["depends_on"] or "aeroqueue-init" in services[name]["depends_on"]
    assert "mysql" in services["aeroqueue-sync"]["depends_on"] and "spark-master" in services["aeroqueue-sync"]["depends_on"]


def test_published_ports_are_the_documented_ones(services: dict[str, Any]) -> None:
    published = {port: name for name, service in services.items() for port in published_ports(service)}
    assert published == PORTS, f"published host ports {published} != the documented {PORTS}"
    for name, service in services.items():
        for spec in service.get("ports") or []:
            host_part = str(spec).rsplit(":", 2)
            if len(host_part) == 3:
                assert host_part[0] in ("127.0.0.1", "0.0.0.0", "::1", "[::1]"), f"{name}: odd bind address in {spec!r}"

    section = readme_section(README.read_text(encoding="utf-8"), "Deploying")
    assert section is not None, "README.md has no '## Deploying' section"
    undocumented = sorted(port for port in published if not mentions_port(section, port))
    assert not undocumented, f"README.md's Deploying section does not mention published port(s) {undocumented}"
    deploy_doc = DEPLOY_README.read_text(encoding="utf-8")
    assert not [p for p in published if not mentions_port(deploy_doc, p)], "deploy/README.md misses a published port"


def test_no_secret_is_written_down(compose: dict[str, Any], raw: str) -> None:
    problems = secret_literals(compose, raw)
    assert not problems, "\n".join(problems)
    # And the secrets the stack needs are there, as references.
    assert environment(compose["services"]["mysql"])["MYSQL_PASSWORD"].startswith("${MYSQL_PASSWORD")
    assert environment(compose["services"]["aeroqueue-sync"])["AEROQUEUE_MYSQL_PASSWORD"].startswith("${MYSQL_PASSWORD")


# -- Aerospike ---------------------------------------------------------------------


def test_aerospike_config(conf: dict[str, Any], services: dict[str, Any]) -> None:
    ns = conf.get("namespace test")
    assert ns is not None, f"no namespace test in {AEROSPIKE_CONF.name} (contexts: {sorted(conf)})"
    assert int(ns["nsup-period"][0]) > 0, "nsup-period must be > 0, or TTL writes are refused (ForbiddenError 22)"
    assert int(ns["default-ttl"][0]) == 0
    assert int(ns["replication-factor"][0]) == 1
    assert "storage-engine memory" in ns, "the namespace must be in memory"
    assert 1024 ** 2 <= size_bytes(ns["max-record-size"][0]) <= 8 * 1024 ** 2
    assert int(conf["network"]["service"]["port"][0]) == 3000

    # The file is the one the server reads: mounted, and named by --config-file
    # (the image rewrites /etc/aerospike/aerospike.conf from its template at start).
    aerospike = services["aerospike"]
    config_path = option_value(command_argv(aerospike.get("command") or []), "--config-file")
    assert config_path, "the aerospike service must start asd with --config-file"
    assert config_path != "/etc/aerospike/aerospike.conf"
    mounts = {
        str(v).split(":")[1]: (COMPOSE.parent / str(v).split(":")[0]).resolve()
        for v in aerospike.get("volumes") or [] if isinstance(v, str) and ":" in v
    }
    assert mounts.get(config_path) == AEROSPIKE_CONF.resolve(), f"{config_path} is not deploy/aerospike.conf"


def test_store_url_points_at_the_aerospike_service(services: dict[str, Any], conf: dict[str, Any]) -> None:
    for name, service in aeroqueue_services(services).items():
        if name.startswith("spark-master"):
            continue
        url = environment(service).get("AEROQUEUE_URL")
        assert url == STORE_URL, f"{name}: AEROQUEUE_URL={url!r}, not {STORE_URL}"
        parsed = parse_url(url)
        (host, port), = parsed.hosts
        assert host in services and port == 3000
        assert f"namespace {parsed.namespace}" in conf


# -- the aeroqueue image -------------------------------------------------------------


def test_commands_use_aeroqueue_subcommands_that_exist(services: dict[str, Any]) -> None:
    problems = []
    ran = set()
    for name, service in aeroqueue_services(services).items():
        steps = invocations(interpolate(shlex.join(command_argv(service.get("command") or [])), REQUIRED_ENV))
        for argv in steps:
            if argv[0] == "aeroqueue":
                ran.add(name)
                problems += [f"{name}: {p}" for p in cli_problems(argv, environment(service))]
            elif argv[0] == "spark-class":
                assert argv[1] in SPARK_CLASSES, f"{name}: unknown Spark class {argv[1]}"
            else:
                problems.append(f"{name}: runs {argv[0]!r}, neither aeroqueue nor spark-class")
    assert {"aeroqueue-init", "aeroqueue-worker", "aeroqueue-sync"} <= ran
    assert not problems, "\n".join(problems)


def documented_commands(markdown: str) -> Iterator[tuple[list[str], bool]]:
    """Each `aeroqueue ...` command line a page shows: (argv, whole). Whole: from a
    ```sh block (a command to run as written); else a span of inline code, which may
    leave out arguments ("`aeroqueue status` shows it"). A block line's comment goes;
    a line ending in a backslash goes on; steps split at ;, &&, ||, | and $( ; words
    before `aeroqueue` (an env assignment, `docker compose exec SERVICE`)
    go; a command with a `...` placeholder is left out."""
    spans = [(block, True) for block in re.findall(r"```sh\n(.*?)```", markdown, re.S)]
    spans += [(span, False) for span in markdown.split("`")[1::2] if "\n" not in span]
    for text, whole in spans:
        for line in text.replace("\\\n", " ").splitlines():
            code = line.split(" #", 1)[0] if whole else line.replace("\\|", "|")
            for step in re.split(r"&&|\|\||;|\||\$\(|<<<", code):
                try:
                    words = shlex.split(step)
                except ValueError:
                    continue  # the rest of a step split inside its quotes: no aeroqueue in it
                at = [i for i, w in enumerate(words) if w == "aeroqueue" or w.endswith("/bin/aeroqueue")]
                if at and "..." not in words:
                    yield ["aeroqueue", *words[at[0] + 1:]], whole


def test_every_aeroqueue_command_the_readmes_show_exists() -> None:
    """The READMEs name only subcommands and options that exist (a renamed or removed
    option left in a page is the drift a new user meets first), and their command
    blocks give each command what it needs."""
    problems, seen = [], 0
    for page in (README, DEPLOY_README, ROOT / "examples" / "README.md"):
        for argv, whole in documented_commands(page.read_text()):
            seen += 1
            found = cli_problems(argv, {})
            if not whole:  # prose names a command without its arguments
                found = [p for p in found if "has no option" in p or "no such subcommand" in p]
            problems += [f"{page.relative_to(ROOT)}: {shlex.join(argv)}: {p}" for p in found]
    assert seen > 50, seen
    assert not problems, "\n".join(problems)


def test_the_stack_runs_what_the_issue_asks(services: dict[str, Any]) -> None:
    def steps(name: str) -> list[list[str]]:
        return invocations(interpolate(shlex.join(command_argv(services[name]["command"])), REQUIRED_ENV))

    assert ["aeroqueue", "udf", "register"] in steps("aeroqueue-init")

    (worker,) = steps("aeroqueue-worker")
    assert worker[:2] == ["aeroqueue", "worker"]
    handler = option_value(worker, "--handler")
    assert handler and handler.startswith("examples."), "the worker runs an example handler"
    assert callable(load_handler(handler))
    replicas = (services["aeroqueue-worker"].get("deploy") or {}).get("replicas") or services["aeroqueue-worker"].get("scale")
    assert isinstance(replicas, int) and replicas >= 2
    drain = float(option_value(worker, "--drain-timeout") or 30)
    grace = duration_s(services["aeroqueue-worker"].get("stop_grace_period", "10s"))
    assert grace > drain, f"stop_grace_period {grace}s must exceed the worker's --drain-timeout {drain}s"

    (sync,) = steps("aeroqueue-sync")
    assert sync[:2] == ["aeroqueue", "sync"]
    assert option_value(sync, "--every") == "5m"
    master = urlsplit(option_value(sync, "--master") or "")
    assert master.scheme == "spark" and master.hostname == "spark-master" and master.port == 7077
    assert option_value(command_argv(services["spark-master"]["command"]), "--port") == "7077"
    target = urlsplit(option_value(sync, "--mysql") or "")
    assert (target.scheme, target.hostname, target.port, target.password) == ("mysql", "mysql", 3306, None)
    mysql_env = environment(services["mysql"])
    assert target.username == interpolate(mysql_env["MYSQL_USER"], {})
    assert target.path.lstrip("/") == interpolate(mysql_env["MYSQL_DATABASE"], {})


def test_dockerfile(dockerfile: list[tuple[str, str]], services: dict[str, Any]) -> None:
    args = {k: v for k, _, v in (a.partition("=") for op, a in dockerfile if op == "ARG")}
    (base,) = [interpolate(a, args) for op, a in dockerfile if op == "FROM"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base), f"base image {base!r}: python:3.11-slim wanted"
    runs = " ".join(a for op, a in dockerfile if op == "RUN")
    assert "default-jre-headless" in runs, "the Spark driver needs a JRE"
    assert re.search(r"pip install [^&]*['\"]?\.\[spark\]", runs), "aeroqueue must be installed with its spark extra"
    assert any(op == "USER" and a not in ("root", "0") for op, a in dockerfile), "run as a non-root user"

    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]
    copied = []
    for op, a in dockerfile:
        if op != "COPY" or a.startswith("--from"):
            continue
        *sources, dest = shlex.split(a)
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert not ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
            copied.append((src, dest))

    # The worker's handler module is importable in the image.
    env = " ".join(a for op, a in dockerfile if op == "ENV")
    pythonpath = re.search(r"PYTHONPATH=(\S+)", env)
    assert pythonpath, "examples/ must be on PYTHONPATH"
    workdirs = [a for op, a in dockerfile if op == "WORKDIR"]
    dest = next(dest for src, dest in copied if src.rstrip("/") == "examples")
    full = PurePosixPath(workdirs[-1]) / dest if not dest.startswith("/") else PurePosixPath(dest)
    assert str(full.parent) in pythonpath.group(1).split(":"), f"{full} is not importable as examples"

    # The Spark cluster runs the aeroqueue image: the executors need aeroqueue, and
    # PySpark refuses executors whose Python differs from the driver's.
    images = {services[name].get("image") for name in aeroqueue_services(services)}
    assert len(images) == 1
    for name in ("spark-master", "spark-worker", "aeroqueue-sync"):
        assert built_here(services[name]), f"{name} must run the image built from Dockerfile"


# -- the checkers catch what they are for ------------------------------------------------


def test_checkers_catch_mistakes() -> None:
    bad = {"services": {"db": {"environment": {"MYSQL_PASSWORD": "hunter2", "OK": "x"}, "command": "mysql --password=hunter2"},
                        "app": {"environment": ["APP_SECRET=s3cret"], "command": ["run", "mysql://u:${PW}@db:3306/x"]},
                        "hc": {"healthcheck": {"test": "MYSQL_PWD=hunter2 mysql"}}}}
    raw_bad = "X: ${MYSQL_PASSWORD:-hunter2}"
    found = secret_literals(bad, raw_bad)
    assert len(found) == 6, found
    good = {"services": {"db": {"environment": {"MYSQL_PASSWORD": "${MYSQL_PASSWORD:?set it}", "MYSQL_RANDOM_ROOT_PASSWORD": "yes"},
                                "command": ["x", "mysql://${U:-u}@db:3306/${D:-d}"],
                                "healthcheck": {"test": 'MYSQL_PWD="$$MYSQL_PASSWORD" mysql'}}}}
    assert secret_literals(good, "") == []

    assert published_ports({"ports": ["3000:3000", "127.0.0.1:8080:80", "9000", {"target": 1, "published": "7000-7001"}]}) == {
        3000, 8080, 7000, 7001}
    assert readme_section("# A\n## Deploying\nport 3000\n## Next\n3306\n", "Deploying") == "\nport 3000\n"
    assert not mentions_port("aerospike://h:30001", 3000) and mentions_port("| 3000 |", 3000)

    assert cli_problems(["aeroqueue", "nosuch"], {})[0].startswith("`aeroqueue nosuch`: aeroqueue has no such subcommand")
    assert "no option --frobnicate" in cli_problems(["aeroqueue", "reap", "--frobnicate"], {})[0]
    assert "needs --handler" in cli_problems(["aeroqueue", "worker", "--list", "x"], {})[0]
    assert cli_problems(["aeroqueue", "worker", "--list", "x"], {"AEROQUEUE_HANDLER": "m:f"}) == []
    assert "needs LIST" in cli_problems(["aeroqueue", "create"], {})[0]
    assert cli_problems(["aeroqueue", "--url", "embedded://:memory:", "udf", "register"], {}) == []
    assert cli_problems(["aeroqueue", "udf"], {}) == ["`aeroqueue udf` is given no subcommand"]
    page = ("```sh\nX=1 aeroqueue load L f.csv --seal   # a comment\naeroqueue worker ... --x\n"
            "spark-submit \\\n  dist/aeroqueue-0.1.0.whl \\\n  sync\n```\nthen `aeroqueue export L \\| head` or `aeroqueue status`")
    assert list(documented_commands(page)) == [
        (["aeroqueue", "load", "L", "f.csv", "--seal"], True), (["aeroqueue", "export", "L"], False),
        (["aeroqueue", "status"], False)]
    assert invocations(["sh", "-c", "aeroqueue udf register && aeroqueue create x"]) == [
        ["aeroqueue", "udf", "register"], ["aeroqueue", "create", "x"]]

    assert interpolate("${A:-x} ${B-y} $$C ${D}", {"B": ""}) == "x  $C "
    with pytest.raises(KeyError):
        interpolate("${P:?required}", {})

    conf = parse_aerospike_conf("namespace t { # c\n nsup-period 0\n storage-engine memory { data-size 1G }\n}\n")
    assert conf == {"namespace t": {"nsup-period": ["0"], "storage-engine memory": {"data-size": ["1G"]}}}
    with pytest.raises(ValueError):
        parse_aerospike_conf("namespace t {\n")
    assert size_bytes("1M") == 1048576 and duration_s("1m30s") == 90 and duration_s("45") == 45
    assert ignored("tests/x.py", ["tests"]) and ignored("a/__pycache__/b.pyc", ["**/__pycache__"])
    assert not ignored("examples/handlers.py", ["tests", ".venv"])
