"""The console's door (issue 18 items 9, 10 and 11), against real `python -m tasks console`
processes on the tests' Redis:

- a secret, password or Flower credential shipped in this repository (deploy/, compose, the
  README's examples) is refused at start, and a cookie forged with any secret, even the real
  one, gets nowhere without a session the server issued;
- failed logins are limited per address and per user with a growing back-off and a logged
  lockout: 40 parallel wrong passwords have at most a handful checked, the right password works
  at once from another address and from the guessing one after its back-off;
- logout and a password change end sessions server-side (a copied cookie is refused);
- cookies are Secure with CONSOLE_SECURE_COOKIES, or behind a trusted proxy that says https.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from http.cookiejar import Cookie
from pathlib import Path

import pytest
import redis

from tests import WORKER_REDIS_URL
from tests.support.workers import ROOT, Proc, wait_until
from tests.test_console_http import (
    CONSOLE,
    PASSWORD,
    USER,
    Browserless,
    console_env,
    start_console,
)

SECRET = "a-test-secret-of-forty-characters-0123456"
# What deploy/k8s/config.yaml shipped before issue 18 (anyone could read them).
SHIPPED_SECRET = "change-me-to-32-random-bytes-or-more-0123456789"
SHIPPED_PASSWORD = "change-me"
# The limiter's numbers (tasks/console/logins.py): free attempts, first back-off.
FREE_PER_ADDRESS = 5
FREE_PER_USER = 10
FIRST_BACKOFF_S = 5.0


@pytest.fixture
def flushed() -> None:
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()


@pytest.fixture
def console(tmp_path: Path, flushed: None) -> Iterator[tuple[Proc, str]]:
    proc, base = start_console(console_env(tmp_path / "c.sqlite", CONSOLE_SECRET=SECRET))
    yield proc, base
    proc.stop()


def _refused(env: dict[str, str]) -> str:
    done = subprocess.run(CONSOLE, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stdout[-500:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(("name", "value", "says"), [
    ("CONSOLE_SECRET", SHIPPED_SECRET, "CONSOLE_SECRET is a value shipped"),
    ("CONSOLE_SECRET", "ChangeMe-please-to-a-long-random-secret-value", "CONSOLE_SECRET is"),
    ("CONSOLE_PASSWORD", SHIPPED_PASSWORD, "CONSOLE_PASSWORD is a value shipped"),
    ("CONSOLE_PASSWORD", "a long password", "CONSOLE_PASSWORD is a value shipped"),
    ("CONSOLE_PASSWORD", "short-pw", "CONSOLE_PASSWORD must be at least 12 characters"),
])
def test_the_console_refuses_to_start_with_a_shipped_secret_or_password(
    tmp_path: Path, name: str, value: str, says: str
) -> None:
    env = console_env(tmp_path / "c.sqlite", **{"CONSOLE_SECRET": SECRET, name: value})
    line = _refused(env)
    assert says in line, line
    assert value not in line


@pytest.mark.parametrize("cwd", ["checkout", "elsewhere"])
def test_flower_refuses_a_shipped_password(tmp_path: Path, cwd: str) -> None:
    import sys

    from tests.support.redis_server import free_port
    from tests.support.workers import platform_env

    env = platform_env(FLOWER_BASIC_AUTH=f"admin:{SHIPPED_PASSWORD}",
                       FLOWER_PORT=str(free_port()))
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "flower"], env=env,
                          cwd=ROOT if cwd == "checkout" else tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "FLOWER_BASIC_AUTH has a password shipped" in out, out[-2000:]


# Where a credential's value could ship: what users copy.
SHIPPED_FILES = ["deploy/**/*", "docker-compose.yml", "Procfile", "README.md", "docs/*.md",
                 ".env*", "Makefile", "Dockerfile"]
# The value is on the assignment's line: `CONSOLE_PASSWORD=` alone (.env.example) is empty.
_ASSIGNED = re.compile(r"(CONSOLE_PASSWORD|CONSOLE_SECRET|FLOWER_BASIC_AUTH)[\"']?\s*[:=][ \t]*"
                       r"(?:'([^']*)'|\"([^\"]*)\"|([^\s,}'\"]+))")
_URL_PASSWORD = re.compile(r"\b[a-z+]+://[^:/@\s\"']*:([^@\s\"'/]+)@")


def shipped_values() -> dict[str, set[str]]:
    """Every literal value the shipped files give a console or Flower credential, and every
    password in a URL they spell (`${VAR}` and `$(command)` are not literals)."""
    found: dict[str, set[str]] = {"CONSOLE_PASSWORD": set(), "CONSOLE_SECRET": set(),
                                  "FLOWER_BASIC_AUTH": set(), "URL": set()}
    paths = {p for pattern in SHIPPED_FILES for p in ROOT.glob(pattern) if p.is_file()}
    for path in paths:
        text = path.read_text(errors="replace")
        for name, *quoted in _ASSIGNED.findall(text):
            value = "".join(quoted)
            # Empty assigns nothing (compose blanks the credentials a container does not use).
            if value and "$" not in value and value not in ("...", "user:password"):
                found[name].add(value)
        # RabbitMQ's own guest:guest (the README's local benchmark) is refused by RabbitMQ
        # itself from anywhere but loopback.
        found["URL"] |= {p for p in _URL_PASSWORD.findall(text)
                         if not p.startswith("$") and p != "guest"}
    return found


def test_every_credential_the_shipped_files_spell_is_refused() -> None:
    from tasks.config.envparse import shipped
    from tasks.console.auth import ShippedCredential, check_credentials
    from tasks.worker.flowerguard import check_basic_auth

    found = shipped_values()
    found["CONSOLE_SECRET"].add(SHIPPED_SECRET)
    found["CONSOLE_PASSWORD"].add(SHIPPED_PASSWORD)
    found["FLOWER_BASIC_AUTH"].add(f"admin:{SHIPPED_PASSWORD}")
    for value in found["CONSOLE_SECRET"]:
        with pytest.raises(ShippedCredential, match="CONSOLE_SECRET"):
            check_credentials(USER, PASSWORD, value)
    for value in found["CONSOLE_PASSWORD"]:
        with pytest.raises(ShippedCredential, match="CONSOLE_PASSWORD"):
            check_credentials(USER, value, SECRET)
    for value in found["FLOWER_BASIC_AUTH"]:
        with pytest.raises(SystemExit, match="FLOWER_BASIC_AUTH"):
            check_basic_auth([value])
    for value in found["URL"] | {"change-me", "rangekeeper"}:
        assert shipped(value), value


def _forged(base: str, secret: str, session: dict[str, object]) -> Browserless:
    """A client holding a session cookie signed with `secret` (Tornado's public format)."""
    from tornado.web import create_signed_value

    forged = Browserless(base)
    value = create_signed_value(secret, "rk_console", json.dumps(session)).decode()
    forged.jar.set_cookie(Cookie(0, "rk_console", value, None, False, "127.0.0.1", False, False,
                                 "/", True, False, None, False, None, None, {}))
    return forged


def test_a_forged_cookie_gets_nowhere_even_signed_with_the_real_secret(
    console: tuple[Proc, str]
) -> None:
    _, base = console
    now = int(time.time())
    for secret in (SHIPPED_SECRET, SECRET):
        for session in ({"user": USER, "csrf": "x", "at": now},
                        {"sid": "made-up", "user": USER, "csrf": "x", "at": now}):
            forged = _forged(base, secret, session)
            assert forged.request("/api/jobs").status == 401
            assert forged.request("/api/deadletters/1/purge", {},
                                  {"X-CSRF-Token": "x"}).status == 401


def _parallel_logins(base: str, count: int, password: str) -> tuple[list[int], float]:
    """`count` clients, each with its login form, post at the same moment; their statuses
    and how long the burst took."""
    clients = [Browserless(base) for _ in range(count)]
    tokens = [c.login_form() for c in clients]
    statuses: list[int] = [0] * count
    start = threading.Barrier(count + 1)

    def post(i: int) -> None:
        start.wait()
        statuses[i] = clients[i].post_login(tokens[i], USER, password).status

    threads = [threading.Thread(target=post, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join(60)
    return statuses, time.monotonic() - began


def _checks_allowed(seconds: float) -> int:
    """Logins the limiter lets through from one address in `seconds` of guessing: the free
    ones, then one per back-off (1 s, 2 s, 4 s...)."""
    return FREE_PER_ADDRESS + 1 + math.ceil(math.log2(seconds / FIRST_BACKOFF_S + 1))


@pytest.mark.timeout(180)
def test_forty_parallel_wrong_passwords_are_throttled_and_the_lockout_is_logged(
    console: tuple[Proc, str]
) -> None:
    proc, base = console
    statuses, took = _parallel_logins(base, 40, "wrong-password-guess")
    checked = statuses.count(401)
    assert set(statuses) <= {401, 429}, statuses
    assert FREE_PER_ADDRESS <= checked <= _checks_allowed(took), (checked, took, statuses)
    assert statuses.count(429) >= 40 - _checks_allowed(took)
    print(f"40 parallel wrong passwords: {checked} checked, {statuses.count(429)} refused "
          f"with 429, in {took:.2f}s")
    proc.wait_for("console: logins locked", timeout=10)
    assert "wrong-password-guess" not in proc.output()
    # The right password from the guessing address waits for the back-off...
    guesser = Browserless(base)
    locked = guesser.login()
    assert locked.status == 429 and int(locked.headers["Retry-After"]) >= 1
    # ... works at once from another address (the user is under its own limit) ...
    assert Browserless(base, source="127.0.0.2").login().status == 302
    # ... and from the guessing address once the back-off has passed.
    time.sleep(int(locked.headers["Retry-After"]))
    assert guesser.login().status == 302
    assert guesser.request("/api/jobs").status == 200


@pytest.mark.timeout(180)
def test_guesses_spread_over_addresses_lock_the_user(console: tuple[Proc, str]) -> None:
    proc, base = console
    for source in ("127.0.0.2", "127.0.0.3"):
        threads = [threading.Thread(target=lambda s=source: Browserless(base, s).login(
            password="wrong-password-guess")) for _ in range(FREE_PER_USER // 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    locked = Browserless(base, "127.0.0.4").login()
    assert locked.status == 429, locked.status
    proc.wait_for(f"user {USER!r}", timeout=10)
    time.sleep(int(locked.headers["Retry-After"]))
    assert Browserless(base, "127.0.0.4").login().status == 302


def _copy(client: Browserless, base: str) -> Browserless:
    """Another client holding a copy of `client`'s cookies (a stolen cookie)."""
    thief = Browserless(base)
    for cookie in client.jar:
        thief.jar.set_cookie(cookie)
    return thief


def test_logout_ends_the_session_on_the_server(console: tuple[Proc, str]) -> None:
    _, base = console
    operator = Browserless(base)
    assert operator.login().status == 302
    thief = _copy(operator, base)
    assert thief.request("/api/jobs").status == 200
    assert operator.request("/logout", {"_csrf": operator.csrf()}).status == 302
    assert thief.request("/api/jobs").status == 401
    assert operator.request("/api/jobs").status == 401


@pytest.mark.timeout(180)
def test_a_password_change_ends_every_session(tmp_path: Path, flushed: None) -> None:
    env = console_env(tmp_path / "c.sqlite", CONSOLE_SECRET=SECRET)
    proc, base = start_console(env)
    try:
        operator = Browserless(base)
        assert operator.login().status == 302
        proc.stop()
        # The same secret and password: the session outlives a restart ...
        proc, base = start_console(env)
        assert operator.request("/api/jobs").status == 200
        proc.stop()
        # ... a new password ends it, though the cookie's signature is still good.
        proc, base = start_console(dict(env, CONSOLE_PASSWORD="a-brand-new-password-77"))
        assert operator.request("/api/jobs").status == 401
        assert Browserless(base).login(password="a-brand-new-password-77").status == 302
    finally:
        proc.stop()


def _session_cookie(answer: list[str], name: str = "rk_console") -> str:
    return next(c for c in answer if c.startswith(f"{name}="))


def _secure(cookie: str) -> bool:
    return any(part.strip().lower() == "secure" for part in cookie.split(";"))


def test_cookies_are_secure_when_the_setting_says_so(tmp_path: Path, flushed: None) -> None:
    proc, base = start_console(console_env(tmp_path / "c.sqlite", CONSOLE_SECRET=SECRET,
                                           CONSOLE_SECURE_COOKIES="1"))
    try:
        client = Browserless(base)
        form = client.request("/login")
        assert _secure(_session_cookie(form.cookies, "_xsrf"))
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form.body)
        assert xsrf
        # The jar keeps Secure cookies off plain HTTP: send the form's cookie by hand.
        token = _session_cookie(form.cookies, "_xsrf").split(";")[0]
        done = client.request("/login", {"_xsrf": xsrf.group(1), "user": USER,
                                          "password": PASSWORD}, {"Cookie": token})
        assert done.status == 302 and _secure(_session_cookie(done.cookies))
    finally:
        proc.stop()


def test_behind_a_trusted_proxy_https_makes_cookies_secure_and_its_client_address_counts(
    tmp_path: Path, flushed: None
) -> None:
    proc, base = start_console(console_env(tmp_path / "c.sqlite", CONSOLE_SECRET=SECRET,
                                           CONSOLE_TRUSTED_PROXIES="127.0.0.1"))
    try:
        via_proxy = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
        done = Browserless(base).login(headers=via_proxy)
        assert done.status == 302 and _secure(_session_cookie(done.cookies))
        plain = Browserless(base).login()
        assert plain.status == 302 and not _secure(_session_cookie(plain.cookies))
        proc.wait_for("logged in from 203.0.113.9", timeout=10)
        # An untrusted peer's headers count for nothing.
        other = Browserless(base, source="127.0.0.2")
        spoofed = other.login(headers=via_proxy)
        assert spoofed.status == 302 and not _secure(_session_cookie(spoofed.cookies))
        proc.wait_for("logged in from 127.0.0.2", timeout=10)
    finally:
        proc.stop()
    wait_until(lambda: proc.popen.poll() is not None, 5, "the console stopped")


def test_without_redis_the_console_fails_closed(tmp_path: Path) -> None:
    """Sessions and login limits live in Redis: with REDIS_URL away nobody logs in (503), and
    nothing behind the login answers."""
    from tests.support.redis_server import free_port

    env = console_env(tmp_path / "c.sqlite", CONSOLE_SECRET=SECRET,
                      REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    proc, base = start_console(env)
    try:
        client = Browserless(base)
        refused = client.login()
        assert refused.status == 503 and "Redis does not answer" in refused.body
        forged = _forged(base, SECRET, {"sid": "any"})
        assert forged.request("/api/jobs").status == 503
        assert client.request("/api/jobs").status == 401
    finally:
        proc.stop()


@pytest.mark.parametrize(("address", "counted"), [
    ("203.0.113.9", "203.0.113.9"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
])
def test_an_ipv6_client_is_counted_by_its_64(address: str, counted: str) -> None:
    from tasks.console.logins import client_key

    assert client_key(address) == counted


def test_the_back_off_doubles_up_to_its_cap_and_every_key_has_a_ttl(
    redis_client: redis.Redis
) -> None:
    """login.lua on a real Redis: lockouts of an address, then of its user, double from the
    first back-off (each plus the failure delay) up to MAX_BACKOFF; a locked-out attempt counts
    nothing; every key expires; a success deletes them all."""
    from tasks.console.keys import login_keys
    from tasks.console.logins import (
        FAILURE_DELAY,
        FREE_PER_ADDRESS,
        FREE_PER_USER,
        LOGIN_WINDOW,
        MAX_BACKOFF,
        LoginLimiter,
    )

    limiter = LoginLimiter(redis_client)
    keys = login_keys("someone", "198.51.100.7")
    rounds = FREE_PER_USER + 3
    lockouts = []
    for _ in range(rounds):
        attempt = limiter.attempt("someone", "198.51.100.7")
        assert attempt.allowed
        lockouts.append((attempt.address_lockout, attempt.user_lockout))
        if lockouts[-1] != (0.0, 0.0):
            refused = limiter.attempt("someone", "198.51.100.7")
            assert not refused.allowed
            assert 0 < refused.retry_after <= max(lockouts[-1]) + FAILURE_DELAY
            assert redis_client.pttl(keys[3]) > 0
            redis_client.delete(keys[2], keys[3])  # the lockouts run out
    doubling = [5.0 * 2**i for i in range(rounds)]
    assert [a for a, _ in lockouts] == [0.0] * (FREE_PER_ADDRESS - 1) + [
        min(d, MAX_BACKOFF) for d in doubling[:rounds - FREE_PER_ADDRESS + 1]]
    assert [u for _, u in lockouts] == [0.0] * (FREE_PER_USER - 1) + doubling[:4]
    assert int(redis_client.get(keys[1]) or 0) == rounds  # refused attempts were not counted
    for key in keys[:2]:
        assert 0 < redis_client.ttl(key) <= LOGIN_WINDOW
    limiter.succeeded("someone", "198.51.100.7")
    assert redis_client.exists(*keys) == 0
