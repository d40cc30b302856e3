"""A real single-node Apache Kafka broker (KRaft mode) that callqa runs by itself on 127.0.0.1.

The jars come from Maven Central through ``pom.xml`` beside this module (no Kafka is packaged for
this machine and no download happens at run time). State lives under ``<state_dir>/kafka``:

- ``libs/``      the resolved jars (built, never committed)
- ``config/``    generated server.properties and log4j2 config
- ``data/``      the KRaft metadata and topic logs
- ``logs/``      broker logs; ``broker.out`` holds the JVM's stdout/stderr
- ``broker.pid`` the PID of the broker this project started (the only process ``stop`` signals)
- ``tls/``       with a SASL_SSL client listener: its own CA and the broker's certificate (see tls.py)

The client listener is PLAINTEXT, or SASL_SSL (``kafka_local_listener``, ``broker start --sasl-ssl``):
TLS with that CA's certificate, PLAIN and SCRAM-SHA-256/512 logins for ``kafka_sasl_username``; the
SCRAM credentials go into the metadata log when the storage is formatted (``--add-scram``), and are
upserted through the Admin API when an already formatted broker is started with SASL_SSL. The KRaft
controller listener stays PLAINTEXT on 127.0.0.1.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from pipeline.broker.security import kafka_config
from pipeline.broker.tls import BrokerTls
from pipeline.config import Settings

POM_RESOURCE = "pom.xml"
KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 8192
# The credentials are written into a JAAS line and a StorageTool argument, which quote with "" and
# split on , = [ ]: keep them to characters that need no escaping there.
SAFE_USERNAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
SAFE_PASSWORD = re.compile(r"[A-Za-z0-9._~+/!@#$%^&*()-]{8,128}")


class BrokerError(RuntimeError):
    """The local broker could not be installed, started or stopped; the message says why."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    answers_metadata: bool
    topics: dict[str, int]  # topic name -> partition count


@dataclass(frozen=True)
class StartResult:
    pid: int
    already_running: bool
    ready_after_s: float


class LocalKafka:
    """Install, start, stop and inspect the project's own Kafka broker."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.kafka_dir.resolve()
        self.libs = self.root / "libs"
        self.config_dir = self.root / "config"
        self.data_dir = self.root / "data"
        self.log_dir = self.root / "logs"
        self.pid_file = self.root / "broker.pid"
        self.listener_file = self.config_dir / "listener"  # the client listener the running broker has
        self.tls = BrokerTls(self.root / "tls")

    @property
    def listener(self) -> str:
        """The client listener's protocol: the running broker's, else the one a start would give it."""
        if self.pid() is not None and self.listener_file.exists():
            return self.listener_file.read_text().strip()
        return self.settings.kafka_local_listener

    @property
    def sasl_ssl(self) -> bool:
        return self.listener == "SASL_SSL"

    # ---- install ---------------------------------------------------------------------------
    def installed(self) -> bool:
        return (self.libs / ".complete").exists()

    def install(self) -> Path:
        """Resolve the broker jars with Maven (once; a marker file makes later calls free)."""
        if self.installed():
            return self.libs
        if shutil.which("mvn") is None:
            raise BrokerError("Maven (mvn) is not on PATH: it is needed to resolve the Kafka jars")
        self.libs.mkdir(parents=True, exist_ok=True)
        pom = resources.files("pipeline.broker").joinpath(POM_RESOURCE)
        with resources.as_file(pom) as pom_path:
            cmd = [
                "mvn", "-q", "-B", "-f", str(pom_path), "dependency:copy-dependencies",
                f"-DoutputDirectory={self.libs}", "-DincludeScope=runtime",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise BrokerError("mvn could not resolve the Kafka jars: " + " | ".join(tail))
        (self.libs / ".complete").write_text("ok\n")
        return self.libs

    # ---- process ---------------------------------------------------------------------------
    def pid(self) -> int | None:
        """PID of the broker we started, if that process is still alive."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not _alive(pid) or not _is_our_broker(pid, self.root):
            return None
        return pid

    def start(self) -> StartResult:
        """Start the broker and return once it answers metadata requests. Concurrent starts (pytest's
        workers, two terminals) take turns: the later ones find the first one's broker running. Racing, the
        loser's JVM failed to bind the port and its clean-up deleted the winner's PID file, leaving a broker
        nothing could stop (`broker stop`: not running; `broker start`: port taken)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "start.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._start()

    def _start(self) -> StartResult:
        existing = self.pid()
        if existing is not None:
            if self.listener != self.settings.kafka_local_listener:
                raise BrokerError(
                    f"the broker running at 127.0.0.1:{self.settings.kafka_port} has a {self.listener} client "
                    f"listener, not {self.settings.kafka_local_listener}; `callqa broker stop` it first"
                )
            return StartResult(pid=existing, already_running=True, ready_after_s=0.0)
        if _port_in_use(self.settings.kafka_port):
            raise BrokerError(
                f"port {self.settings.kafka_port} on 127.0.0.1 is taken by another process; "
                "set CALLQA_KAFKA_PORT to a free port"
            )
        self.install()
        began = time.monotonic()
        if self.settings.kafka_local_listener == "SASL_SSL":
            self._check_credentials()
            self.tls.ensure()
        properties = self._write_config()
        formatted_now = self._format_storage(properties)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_dir / "broker.out", "ab")  # noqa: SIM115 - handed to the child process
        env = dict(os.environ, KAFKA_HEAP_OPTS=self.settings.kafka_heap)
        proc = subprocess.Popen(
            self._java(KAFKA_MAIN, str(properties)),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,  # survives the CLI that started it
        )
        out.close()
        self.pid_file.write_text(f"{proc.pid}\n")
        self.listener_file.write_text(f"{self.settings.kafka_local_listener}\n")
        deadline = began + self.settings.broker_start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise BrokerError(
                    f"broker exited with code {proc.returncode} during start; see {self.log_dir / 'broker.out'}"
                )
            if self._answers_metadata(timeout=1.0):
                if self.sasl_ssl and not formatted_now:
                    self._upsert_scram_or_stop()
                return StartResult(pid=proc.pid, already_running=False, ready_after_s=time.monotonic() - began)
            time.sleep(0.25)
        self.stop()
        raise BrokerError(f"broker did not answer within {self.settings.broker_start_timeout_s:.0f} s")

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop our broker cleanly (SIGTERM, then SIGKILL after timeout). True if one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True

    def status(self) -> BrokerStatus:
        pid = self.pid()
        topics: dict[str, int] = {}
        answers = False
        if pid is not None:
            try:
                md = self._admin().list_topics(timeout=3.0)
                answers = True
                topics = {
                    name: len(t.partitions) for name, t in sorted(md.topics.items()) if not name.startswith("__")
                }
            except Exception:  # noqa: BLE001 - status reports, it does not fail
                answers = False
        return BrokerStatus(pid is not None, pid, self.settings.bootstrap, answers, topics)

    # ---- internals -------------------------------------------------------------------------
    def _java(self, main: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise BrokerError("java is not on PATH: the Kafka broker needs Java 17")
        log4j = self.config_dir / "log4j2.properties"
        return [
            java, *self.settings.kafka_heap.split(), "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={self.log_dir}",
            f"-Dcallqa.broker.root={self.root}",  # lets pid() tell our broker from any other JVM
            "-cp", str(self.libs / "*"), main, *args,
        ]

    def _write_config(self) -> Path:
        s = self.settings
        self.config_dir.mkdir(parents=True, exist_ok=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{s.kafka_controller_port}",
            **self._listener_properties(),
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "12",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # A single local node: consumers should join at once, not wait for more members.
            "group.initial.rebalance.delay.ms": "0",
            # Kafka's floor is 6 s; a worker may ask for less (CALLQA_KAFKA_SESSION_TIMEOUT_S) so that a killed
            # one's calls are taken over sooner.
            "group.min.session.timeout.ms": "1000",
            "auto.create.topics.enable": "false",
            "log.retention.check.interval.ms": "60000",
        }
        path = self.config_dir / "server.properties"
        path.touch(mode=0o600)  # it holds the SASL password in SASL_SSL mode: owner only
        os.chmod(path, 0o600)
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.config_dir / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.file.type = RollingFile\n"
            "appender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_dir}/server.log\n"
            f"appender.file.filePattern = {self.log_dir}/server.log.%i\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "appender.file.policies.type = Policies\n"
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy\n"
            "appender.file.policies.size.size = 20MB\n"
            "appender.file.strategy.type = DefaultRolloverStrategy\n"
            "appender.file.strategy.max = 3\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = FILE\n"
        )
        return path

    def _listener_properties(self) -> dict[str, str]:
        s = self.settings
        controller = f"CONTROLLER://127.0.0.1:{s.kafka_controller_port}"
        if s.kafka_local_listener != "SASL_SSL":
            return {
                "listeners": f"PLAINTEXT://127.0.0.1:{s.kafka_port},{controller}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{s.kafka_port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            }
        user, password = s.kafka_sasl_username, s.kafka_sasl_password.get_secret_value()
        scram_module = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{s.kafka_port},{controller}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{s.kafka_port}",
            "controller.listener.names": "CONTROLLER",
            # The node talks to itself over the client listener, logged in with PLAIN as the same user.
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config":
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{user}" password="{password}" user_{user}="{password}";',
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram_module,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram_module,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.tls.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.tls.ca_cert),
            "ssl.client.auth": "none",
        }

    def _check_credentials(self) -> None:
        """The SASL_SSL broker's user comes from the settings: both must be there and quotable."""
        s = self.settings
        if not SAFE_USERNAME.fullmatch(s.kafka_sasl_username):
            raise BrokerError("a SASL_SSL local broker needs CALLQA_KAFKA_SASL_USERNAME: 1-64 letters, digits, . _ -")
        if not SAFE_PASSWORD.fullmatch(s.kafka_sasl_password.get_secret_value()):
            raise BrokerError("a SASL_SSL local broker needs CALLQA_KAFKA_SASL_PASSWORD: 8-128 letters, digits "
                              "or ._~+/!@#$%^&*()-")

    def _scram_arguments(self) -> list[str]:
        if self.settings.kafka_local_listener != "SASL_SSL":
            return []
        user, password = self.settings.kafka_sasl_username, self.settings.kafka_sasl_password.get_secret_value()
        args = []
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            args += ["--add-scram", f'{mechanism}=[name="{user}",password="{password}"]']
        return args

    def _format_storage(self, properties: Path) -> bool:
        """Format the KRaft log dir once (True if done now); a formatted dir keeps its cluster id and topics."""
        if (self.data_dir / "meta.properties").exists():
            return False
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cluster_id = "-"
        while cluster_id.startswith("-"):  # StorageTool would read an id starting with "-" as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        proc = subprocess.run(
            self._java(STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(properties), "--ignore-formatted",
                       *self._scram_arguments()),
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            raise BrokerError("formatting the KRaft storage failed: " + self._redact(" | ".join(tail)))
        return True

    def _upsert_scram_or_stop(self) -> None:
        try:
            self._upsert_scram_user()
        except BrokerError:
            self.stop()
            raise

    def _upsert_scram_user(self) -> None:
        """Give the settings' user SCRAM credentials on a broker formatted without them (or with others)."""
        user, password = self.settings.kafka_sasl_username, self.settings.kafka_sasl_password.get_secret_value()
        admin = self._admin()  # held until the futures are done: a dropped client cancels them
        try:
            # One request per mechanism: the broker refuses two changes of one user in a request.
            for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
                upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, SCRAM_ITERATIONS),
                                                      password.encode())
                for future in admin.alter_user_scram_credentials([upsert]).values():  # type: ignore[arg-type]
                    future.result(timeout=30)
        except KafkaException as exc:
            raise BrokerError(f"could not give user {user!r} SCRAM credentials: {exc.args[0].str()}") from None

    def _redact(self, text: str) -> str:
        password = self.settings.kafka_sasl_password.get_secret_value()
        return text.replace(password, "***") if password else text

    def _client_settings(self) -> Settings:
        """How this project's own admin reaches the local broker: PLAIN over TLS with the CA made here."""
        if not self.sasl_ssl:
            return self.settings.model_copy(update={"kafka_security_protocol": "PLAINTEXT",
                                                    "bootstrap_servers": f"127.0.0.1:{self.settings.kafka_port}"})
        return self.settings.model_copy(update={
            "bootstrap_servers": f"127.0.0.1:{self.settings.kafka_port}", "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "PLAIN", "kafka_ssl_ca_file": self.tls.ca_cert, "kafka_ssl_check_hostname": True,
            "kafka_ssl_cert_file": None, "kafka_ssl_key_file": None,
        })

    def _admin(self) -> AdminClient:
        # librdkafka logs every refused connection; a probe expects those, so keep them quiet.
        conf = {**kafka_config(self._client_settings()), "socket.timeout.ms": 3000, "logger": _QUIET}
        return AdminClient(conf)

    def _answers_metadata(self, timeout: float) -> bool:
        if not _port_in_use(self.settings.kafka_port):
            return False
        try:
            md = self._admin().list_topics(timeout=timeout)
        except Exception:  # noqa: BLE001 - not ready yet
            return False
        return bool(md.brokers)


_QUIET = logging.getLogger("callqa.broker.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return True
    return state != "Z"


def _is_our_broker(pid: int, root: Path) -> bool:
    """Only signal a process whose command line names this state folder (PIDs get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"-Dcallqa.broker.root={root}".encode() in cmdline


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses right now (for tests and benchmarks).

    Taken below Linux's ephemeral range (32768+): a port the OS hands out for port 0 can be given
    again as the local port of an outgoing client connection before our server binds it.
    """
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found between 20000 and 32000")


def _port_in_use(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
