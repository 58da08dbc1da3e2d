"""deploy/ checked offline: the compose file, the Dockerfile, the systemd
unit and its environment file name only settings `sandhold serve` has (read
from the real binary's --help), and keep the shape the docs promise (two
replicas on PostgreSQL and Redis, the host engine's socket, hardening).
No image is pulled or built: no registry is reachable here."""

import os
import re
import shutil
import subprocess

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(REPO, "deploy")


@pytest.fixture(scope="module")
def serve_variables():
    """Every SANDHOLD_* variable `sandhold serve` reads, from its --help."""
    out = subprocess.run([os.environ["SANDHOLD_BIN"], "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    names = set(re.findall(r"\[env: (SANDHOLD_[A-Z_]+)", out))
    # Tokens have a variable but no flag (a command line is public).
    assert "SANDHOLD_TOKENS" in out, out
    names.add("SANDHOLD_TOKENS")
    assert {"SANDHOLD_LISTEN", "SANDHOLD_DATABASE_URL", "SANDHOLD_METRICS_LISTEN"} <= names, out
    return names


@pytest.fixture(scope="module")
def compose():
    with open(os.path.join(DEPLOY, "compose.yaml")) as f:
        return yaml.safe_load(f)


def replicas(compose):
    return {name: svc for name, svc in compose["services"].items() if name.startswith("sandhold")}


def interpolated(value, env):
    """Compose's ${VAR:-default} and ${VAR:?message} with `env`."""
    def one(m):
        name, op, rest = m.group(1), m.group(2), m.group(3)
        if name in env:
            return env[name]
        if op == ":?":
            raise AssertionError(f"{name} is required: {rest}")
        return rest or ""
    return re.sub(r"\$\{([A-Z_]+)(?:(:-|:\?)([^}]*))?\}", one, str(value))


def test_compose_runs_two_replicas_on_postgres_and_redis(compose, serve_variables):
    services = compose["services"]
    assert {"postgres", "redis"} <= set(services)
    reps = replicas(compose)
    assert len(reps) == 2, sorted(reps)
    env = {"POSTGRES_PASSWORD": "pw-123", "SANDHOLD_TOKENS": "acme=token-1234567"}
    ids, host_ports = set(), []
    for name, svc in reps.items():
        assert svc["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert os.path.isfile(os.path.join(DEPLOY, svc["build"]["context"], svc["build"]["dockerfile"]))
        variables = {k: interpolated(v, env) for k, v in svc["environment"].items()}
        unknown = set(variables) - serve_variables
        assert not unknown, f"{name} sets variables sandhold does not read: {unknown}"
        assert variables["SANDHOLD_DATABASE_URL"].startswith("postgres://sandhold:pw-123@postgres:5432/")
        assert variables["SANDHOLD_REDIS_URL"] == "redis://redis:6379"
        assert variables["SANDHOLD_TOKENS"] == env["SANDHOLD_TOKENS"], "tokens: beyond loopback they are required"
        assert not variables["SANDHOLD_LISTEN"].startswith("127."), "reachable from the other containers"
        ids.add(variables["SANDHOLD_REPLICA_ID"])
        assert set(svc["depends_on"]) == {"postgres", "redis"}
        # The host engine, and the data dir at the same path inside and out
        # (the engine resolves bind-mount sources on the host).
        volumes = [interpolated(v, env) for v in svc["volumes"]]
        assert "/var/run/docker.sock:/var/run/docker.sock" in volumes
        data_dir = variables["SANDHOLD_DATA_DIR"]
        assert f"{data_dir}:{data_dir}" in volumes, volumes
        grpc_port = variables["SANDHOLD_LISTEN"].rsplit(":", 1)[1]
        metrics_port = variables["SANDHOLD_METRICS_LISTEN"].rsplit(":", 1)[1]
        published = {p.rsplit(":", 1)[1]: p.rsplit(":", 2)[-2] for p in svc["ports"]}
        assert set(published) == {grpc_port, metrics_port}, svc["ports"]
        for p in svc["ports"]:
            assert p.startswith("127.0.0.1:"), f"published on loopback only by default: {p}"
        host_ports += published.values()
    assert len(ids) == 2, "each replica has its own id"
    assert len(set(host_ports)) == len(host_ports), "host ports collide"
    with pytest.raises(AssertionError, match="SANDHOLD_TOKENS"):
        interpolated(reps["sandhold-1"]["environment"]["SANDHOLD_TOKENS"], {})


def test_compose_config_when_compose_is_installed():
    docker = shutil.which("docker")
    probe = docker and subprocess.run([docker, "compose", "version"], capture_output=True)
    if not docker or probe.returncode != 0:
        pytest.skip("docker compose is not installed; the YAML checks above still ran")
    env = dict(os.environ, POSTGRES_PASSWORD="pw-123", SANDHOLD_TOKENS="acme=token-1234567")
    out = subprocess.run([docker, "compose", "-f", os.path.join(DEPLOY, "compose.yaml"), "config"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "sandhold-2" in out.stdout


def test_dockerfile_builds_release_on_rust_and_runs_on_debian_slim(serve_variables):
    with open(os.path.join(DEPLOY, "docker", "Dockerfile")) as f:
        text = f.read()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    names = {alias: image for image, alias in stages}
    assert names["build"].startswith("rust:"), stages
    assert names["sandhold"].startswith("debian:") and names["sandhold"].endswith("-slim"), stages
    assert names["agent"] == "scratch"
    assert stages[-1][1] == "sandhold", "the control plane is the default target"
    assert "cargo build --release --locked -p control-plane --bin sandhold" in text
    assert "scripts/build-agent-static --release" in text
    assert os.access(os.path.join(REPO, "scripts", "build-agent-static"), os.X_OK)
    env_names = set(re.findall(r"\b(SANDHOLD_[A-Z_]+)=", text)) - {"SANDHOLD_STATIC_TARGET_DIR"}
    assert env_names and env_names <= serve_variables, env_names - serve_variables
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/sandhold"\]$', text, re.M)
    assert re.search(r'^CMD \["serve"\]$', text, re.M)
    # Nothing the image build needs is kept out of the context.
    with open(os.path.join(REPO, ".dockerignore")) as f:
        ignored = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    assert not ignored & {"proto", "shared", "scripts", "control-plane", "sandbox-agent", "Cargo.lock"}


def test_systemd_unit_is_hardened_and_its_env_file_is_real(serve_variables, tmp_path):
    unit_path = os.path.join(DEPLOY, "systemd", "sandhold.service")
    with open(unit_path) as f:
        unit = f.read()
    settings = dict(re.findall(r"^([A-Za-z]+)=(.*)$", unit, re.M))
    assert settings.get("User") == "sandhold" or settings.get("DynamicUser") == "yes"
    assert settings["ProtectSystem"] == "strict"
    assert settings["NoNewPrivileges"] == "yes"
    assert settings["StateDirectory"] == "sandhold"
    assert settings["Restart"] in ("on-failure", "always")
    assert settings["CapabilityBoundingSet"] == ""
    assert settings["ExecStart"].endswith("sandhold serve")
    with open(os.path.join(DEPLOY, "systemd", "sandhold.sysusers")) as f:
        assert re.search(r"^u sandhold ", f.read(), re.M), "the dedicated user is declared"
    with open(os.path.join(DEPLOY, "systemd", "sandhold.service.d", "docker.conf")) as f:
        drop_in = dict(re.findall(r"^([A-Za-z]+)=(.*)$", f.read(), re.M))
    assert set(drop_in["CapabilityBoundingSet"].split()) == {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}

    with open(os.path.join(DEPLOY, "systemd", "sandhold.env.example")) as f:
        env_names = set(re.findall(r"^(SANDHOLD_[A-Z_]+)=", f.read(), re.M))
    assert env_names and env_names <= serve_variables, env_names - serve_variables

    analyze = shutil.which("systemd-analyze")
    if analyze:
        # verify wants the ExecStart binary to exist: point it at the one built.
        copy = tmp_path / "sandhold.service"
        copy.write_text(unit.replace("/usr/local/bin/sandhold", os.environ["SANDHOLD_BIN"]))
        out = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                             env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
        assert out.returncode == 0 and not out.stderr.strip(), out.stderr
