"""Property-based tests (hypothesis): the spec parser, the config validator and the API
over a real Unix socket, fed random and hostile input.

Every rejection is a clear error (``SpecError``/``ConfigError``, or a 4xx with a message),
never a crash or a 500, and a rejected request changes nothing in the database. The runs
are derandomized (the same examples every time) and small enough for CI.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer_tui.engine.config import ConfigError, parse_config, parse_config_text
from gpulayer_tui.engine.spec import JobSpec, SpecError, parse_spec
from gpulayer_tui.fields import unsafe_characters

from .conftest import Served
from .raw_http import UnixHTTPConnection

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SPEC_FIELDS = [
    "kind",
    "command",
    "shell",
    "cwd",
    "env",
    "name",
    "project",
    "gpus",
    "vram_gb",
    "domain",
    "exclusive",
    "notify",
    "depends_on",
    "timeout",
    "priority",
]

hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "\0",
            "../../x",
            "/../../etc/passwd",
            "'; DROP TABLE jobs; --",
            "$(touch pwned)",
            "\ud800",
            "名前🚀",
            "a\nb",
            "gpu0",
            "cpu",
            "x" * 70_000,
        ]
    ),
)
hostile_numbers = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -0.0, 5e-324]),
)
json_scalars = st.one_of(st.none(), st.booleans(), hostile_numbers, hostile_text)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(hostile_text, inner, max_size=5)
    ),
    max_leaves=12,
)
field_values = st.one_of(
    json_values,
    st.lists(hostile_text, max_size=4),
    st.dictionaries(hostile_text, hostile_text, max_size=3),
    st.lists(
        st.one_of(hostile_numbers, st.fixed_dictionaries({"job": hostile_numbers})), max_size=3
    ),
)
spec_like = st.dictionaries(
    st.one_of(st.sampled_from(SPEC_FIELDS), hostile_text), field_values, max_size=6
)
bodies = st.one_of(json_values, spec_like)


def _strip(value: str) -> str:
    return value.removeprefix("gpulayer-tui: ")


# -- the spec parser --------------------------------------------------------------------------


@FUZZ
@given(bodies)
def test_spec_parser_accepts_or_names_the_problem(data: Any) -> None:
    try:
        spec = parse_spec(data)
    except SpecError as err:
        assert str(err).strip(), "a rejection must say why"
        return
    assert isinstance(spec, JobSpec)
    # What was accepted is consistent: it round-trips, and its derived values are usable.
    again = parse_spec(spec.model_dump(mode="json", exclude_none=True))
    assert again == spec
    assert spec.default_name()
    for dep in spec.dependencies:
        assert 1 <= dep.job <= 2**63 - 1
    assert (spec.command is None) != (spec.shell is None)


valid_specs = st.fixed_dictionaries(
    {
        # (a program name is not blank; later words may be anything but NUL)
        "command": st.tuples(
            st.text(min_size=1).filter(lambda s: "\0" not in s and s.strip()),
            st.lists(st.text(min_size=1).filter(lambda s: "\0" not in s)),
        ).map(lambda parts: [parts[0], *parts[1]])
    },
    optional={
        # (the name rule: nothing a terminal acts on, see fields.unsafe_characters)
        "name": st.text(min_size=1, max_size=200).filter(lambda s: not unsafe_characters(s)),
        "env": st.dictionaries(
            st.text(min_size=1).filter(lambda s: "=" not in s and "\0" not in s),
            st.text().filter(lambda s: "\0" not in s),
            max_size=4,
        ),
        "gpus": st.integers(0, 64),
        "priority": st.integers(-1_000_000, 1_000_000),
        "timeout": st.floats(min_value=0.001, max_value=3600),
        "depends_on": st.lists(st.integers(1, 2**63 - 1), max_size=3),
    },
)


@FUZZ
@given(valid_specs)
def test_valid_specs_are_accepted(data: dict[str, Any]) -> None:
    spec = parse_spec(data)
    assert spec.command == data["command"]
    assert spec.env == data.get("env", {})


# -- the config validator ---------------------------------------------------------------------

CONFIG_SECTIONS = ["engine", "cpu", "health", "ui", "domains", "security", "limits", "services"]
config_like = st.dictionaries(
    st.one_of(st.sampled_from(CONFIG_SECTIONS), hostile_text),
    st.one_of(
        json_values,
        st.dictionaries(
            st.one_of(
                st.sampled_from(
                    [
                        "sample_interval",
                        "slots",
                        "gpu",
                        "degrade_after",
                        "theme",
                        "allowed_uids",
                        "allowed_groups",
                        "active_jobs",
                        "submissions_in_flight",
                        "gpu0",
                    ]
                ),
                hostile_text,
            ),
            field_values,
            max_size=4,
        ),
    ),
    max_size=4,
)


@FUZZ
@given(config_like)
def test_config_validator_accepts_or_names_the_key(data: dict[str, Any]) -> None:
    try:
        parse_config(data, "fuzz.toml")
    except ConfigError as err:
        assert str(err).startswith("fuzz.toml: "), err
        # ... and names where: a key under one of the sections given, written as TOML
        # writes it (quoted unless bare: an empty one is ""), or the top level
        where = str(err).removeprefix("fuzz.toml: ").removeprefix("unknown key '")
        named = [
            where.startswith((f"{key}:", f"{key}.", f"{key}'"))
            for key in (
                s
                if re.fullmatch(r"[A-Za-z0-9_-]+", str(s))
                else json.dumps(str(s), ensure_ascii=False)
                for s in data
            )
        ]
        assert any(named) or where.startswith("(top level)"), err


toml_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "[engine]",
                "[security]",
                "[limits]",
                "[domains.a]",
                "[[x]]",
                "gpu = 0",
                "slots = -1",
                "allowed_uids = [1, 2]",
                'allowed_groups = ["root", 4294967295]',
                "active_jobs = 99999999999999999999",
                "sample_interval = nan",
                "x = 1979-05-27T07:32:00Z",
                "a = [[[[[[[[[[1]]]]]]]]]]",
                'theme = "\\u0000"',
            ]
        ),
        st.text(max_size=30),
    ),
    max_size=8,
)


@FUZZ
@given(toml_lines)
def test_config_text_accepts_or_names_the_problem(lines: list[str]) -> None:
    try:
        parse_config_text("\n".join(lines), "fuzz.toml")
    except ConfigError as err:
        assert str(err).startswith("fuzz.toml: "), err


def test_config_file_that_is_not_text_is_a_clear_error(tmp_path: Path) -> None:
    from gpulayer_tui.engine.config import load_config

    path = tmp_path / "config.toml"
    path.write_bytes(b"[engine]\nsample_interval = \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(path)
    path.write_text("a = " + "[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match=r"config\.toml: not valid TOML"):
        load_config(path)


# -- the API over a real Unix socket ----------------------------------------------------------


class Api:
    """One keep-alive connection to a real ``--serve`` and a view of its database."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.conn = UnixHTTPConnection(served.home / "engine.sock", timeout=30)
        self.db = sqlite3.connect(f"file:{served.home / 'gpulayer.db'}?mode=ro", uri=True)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        try:
            status, data, raw = self.conn.call(method, path, body)
        except (ConnectionError, OSError):
            # The server may close a connection after an error; a new one must work.
            self.conn.close()
            status, data, raw = self.conn.call(method, path, body)
        assert status < 500, (status, raw[:500])
        if status >= 400:
            assert isinstance(data, dict) and isinstance(data.get("error"), str), raw[:500]
            assert data["error"].strip(), "a rejection must say why"
        return status, data

    def snapshot(self) -> tuple[Any, ...]:
        jobs = self.db.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM jobs").fetchone()
        events = self.db.execute("SELECT COUNT(*) FROM events").fetchone()
        domains = self.db.execute("SELECT * FROM domain_state ORDER BY name").fetchall()
        return (*jobs, *events, tuple(domains))


@pytest.fixture
def api(served: Served) -> Iterator[Api]:
    """A served engine whose job 1 never runs (its domain is drained): accepted fuzz jobs
    depend on it, so nothing random is ever executed."""
    served.start("--simulate", "1xA100-80GB")
    client = Api(served)
    status, _ = client.call("POST", "/v1/domains/gpu0/drain", b'{"reason": "fuzz"}')
    assert status == 200
    status, data = client.call("POST", "/v1/jobs", b'{"command": ["true"], "gpus": 1}')
    assert status == 201 and data["job"]["id"] == 1 and data["job"]["status"] == "queued"
    yield client
    client.conn.close()
    client.db.close()
    assert served.proc is not None and served.proc.poll() is None, "the engine died"
    log = served.stop()
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]


def _encode(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


def _harmless(body: Any) -> Any:
    """A body that the engine may accept is made harmless: it can only wait for job 1."""
    try:
        parse_spec(body)
    except SpecError:
        return body
    safe = {k: v for k, v in body.items() if k not in ("command", "shell", "depends_on")}
    return {**safe, "command": ["true"], "depends_on": [1]}


@FUZZ
@given(body=bodies)
def test_api_submit_rejects_with_a_4xx_and_changes_nothing(api: Api, body: Any) -> None:
    body = _harmless(body)
    before = api.snapshot()
    status, data = api.call("POST", "/v1/jobs", _encode(body))
    after = api.snapshot()
    if status == 201:
        assert after[0] == before[0] + 1 and data["job"]["id"] == after[1]
        assert data["job"]["status"] in ("queued", "failed")
    else:
        assert 400 <= status < 500
        assert after == before


@FUZZ
@given(items=st.lists(bodies, min_size=1, max_size=4), raw=st.binary(max_size=200))
def test_api_batches_and_raw_bytes_are_all_or_nothing(
    api: Api, items: list[Any], raw: bytes
) -> None:
    items = [_harmless(item) for item in items]
    before = api.snapshot()
    status, data = api.call("POST", "/v1/jobs", _encode({"jobs": items}))
    after = api.snapshot()
    if status == 201:
        assert after[0] == before[0] + len(items) == before[0] + len(data["jobs"])
    else:
        assert after == before
    before = after
    status, _ = api.call("POST", "/v1/jobs", raw)
    if status != 201:
        assert api.snapshot() == before


path_part = st.one_of(
    hostile_text.filter(lambda s: s not in ("1", "gpu0", "cpu") and len(s) < 1000),
    st.integers(min_value=2, max_value=10**25).map(str),
    # ("01" names job 1, the fixture's own, which a cancel then stopped with 202: "02" is
    # the leading zero on an id that does not exist)
    st.sampled_from(["0", "-1", "\u00b2", "\u0661", "1e3", "00", "02", "9" * 30, " 2", "%00"]),
)
query_value = st.one_of(hostile_text.filter(lambda s: len(s) < 1000), hostile_numbers.map(str))


@FUZZ
@given(
    job=path_part,
    domain=path_part,
    query=st.dictionaries(
        st.sampled_from(["status", "limit", "before", "offset", "timeout"]),
        query_value,
        max_size=3,
    ),
    body=json_values,
    pid=st.one_of(
        json_values.filter(lambda v: not isinstance(v, int) or isinstance(v, bool)),
        st.integers(max_value=0),
        st.integers(min_value=2**22 + 1),
    ),
)
def test_api_routes_answer_hostile_ids_queries_and_bodies_with_4xx(
    api: Api, job: str, domain: str, query: dict[str, str], body: Any, pid: Any
) -> None:
    before = api.snapshot()
    qs = "&".join(f"{k}={quote(v, safe='', errors='surrogatepass')}" for k, v in query.items())
    j = quote(job, safe="", errors="surrogatepass")
    d = quote(domain, safe="", errors="surrogatepass")
    statuses: dict[str, int] = {}
    for method, path, payload in [
        ("GET", f"/v1/jobs?{qs}", None),
        ("GET", f"/v1/jobs/{j}?{qs}", None),
        ("GET", f"/v1/jobs/{j}/logs?{qs}", None),
        ("GET", f"/v1/jobs/{j}/wait?timeout=0", None),
        ("POST", f"/v1/jobs/{j}/cancel", None),
        ("POST", f"/v1/domains/{d}/drain", _encode(body)),
        ("POST", f"/v1/domains/{d}/release", None),
        ("POST", f"/v1/domains/{d}/forget", _encode(body)),
        ("GET", f"/v1/{j}", None),
    ]:
        statuses[f"{method} {path}"] = api.call(method, path, payload)[0]
    assert {route: s for route, s in statuses.items() if s != 200 and not 400 <= s < 500} == {}
    adopt = {"pid": pid}
    if isinstance(body, dict):
        adopt.update({k: v for k, v in body.items() if k != "pid"})
    status, data = api.call("POST", "/v1/adopt", _encode(adopt))
    after = api.snapshot()
    if status == 201:  # an adoption refused after checking the pid is kept in history
        assert data["job"]["status"] == "failed" and after[0] == before[0] + 1
    else:
        assert after == before


def test_api_survives_deep_nesting_huge_numbers_and_odd_encodings(api: Api) -> None:
    before = api.snapshot()
    refused: dict[bytes, int] = {}
    for raw in [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"command": ["true"], "priority": ' + b"9" * 5000 + b"}",
        b'{"command": ["true"], "timeout": 1e999}',
        b'{"command": ["true"], "vram_gb": NaN}',
        b"\xff\xfe{\x00}",
        b'{"command": ["true"], "depends_on": [{"job": 9223372036854775808}]}',
        b'{"command": ["true"], "depends_on": [99999999999999999999999]}',
        b'{"command": ["true"], "depends_on": [0]}',
        b'{"jobs": [' + b'{"command": ["true"], "cwd": "rel"},' * 1000 + b"1]}",
    ]:
        refused[raw[:80]] = api.call("POST", "/v1/jobs", raw)[0]
    # Every case is tried before one assertion: a failing case does not hide the rest.
    assert {raw: status for raw, status in refused.items() if not 400 <= status < 500} == {}
    answered: dict[str, int] = {}
    for path in [
        "/v1/jobs/99999999999999999999999",
        "/v1/jobs/%C2%B2",
        "/v1/jobs/1/logs?offset=99999999999999999999999",
        "/v1/jobs/1/logs?offset=9223372036854775807",
        "/v1/jobs?before=99999999999999999999999",
        "/v1/jobs?status=" + ",".join(["queued"] * 1000),
        "/v1/jobs/1/wait?timeout=inf",
        "/v1/jobs/1/wait?timeout=nan",
    ]:
        answered[path] = api.call("GET", path)[0]
    assert {path: s for path, s in answered.items() if s not in (200, 400, 404)} == {}
    assert api.snapshot() == before
    # Text that is not valid Unicode (a lone surrogate escape) is accepted and stored
    # escaped; it never wedges the database writer. The name taken from it is held to the
    # name rule: printable, the character written as an escape.
    status, data = api.call("POST", "/v1/jobs", b'{"command": ["\\udcff"], "depends_on": [1]}')
    assert status == 201 and data["job"]["name"] == "\\xff"  # (the byte it stands for)
    assert data["job"]["spec"]["command"] == ["\udcff"]
    stored = api.db.execute("SELECT name FROM jobs WHERE id = ?", (data["job"]["id"],))
    assert stored.fetchone()[0] == "\\xff"
    status, data = api.call("POST", "/v1/jobs", b'{"command": ["true"], "depends_on": [1]}')
    assert status == 201 and data["job"]["status"] == "queued"


def test_numbers_of_thousands_of_digits_are_refused_by_name(api: Api) -> None:
    # Past 4,300 digits int() raises: every route below was a 500, and a body's number
    # was refused in Python's words ("use sys.set_int_max_str_digits()").
    huge = "1" + "0" * 5000
    answered: dict[str, tuple[int, str]] = {}
    for method, path, body in [
        ("GET", f"/v1/jobs/{huge}", None),
        ("POST", f"/v1/jobs/{huge}/cancel", None),
        ("PATCH", f"/v1/jobs/{huge}", b'{"priority": 1}'),
        ("GET", f"/v1/processes/{huge}", None),
        ("POST", f"/v1/processes/{huge}/signal", b'{"signal": "TERM"}'),
        ("GET", f"/v1/jobs?limit={huge}", None),
        ("POST", "/v1/jobs", b'{"command": ["true"], "priority": ' + huge.encode() + b"}"),
    ]:
        status, data = api.call(method, path, body)
        answered[f"{method} {path[:30]}"] = (status, data["error"])
    assert {k: v for k, v in answered.items() if v[0] != 400} == {}
    errors = " ".join(error for _, error in answered.values())
    assert "set_int_max_str_digits" not in errors
    assert "a job id is at most 9223372036854775807, not 100000000000... (5001 digits)" in errors
    assert "the request body has a number of over 4,300 digits" in errors
