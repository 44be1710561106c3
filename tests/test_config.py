"""Store URLs: accepted forms, the default, and one clear error per malformed part."""

from __future__ import annotations

import re

import pytest

from aeroqueue.config import default_store_path, mask_passwords, mask_url, parse_url, resolve_url
from aeroqueue.errors import InvalidURL


def test_aerospike_url_with_several_hosts():
    url = parse_url("aerospike://a.example:3000,10.0.0.2:3100/prod")
    assert url.scheme == "aerospike" and url.namespace == "prod"
    assert url.hosts == (("a.example", 3000), ("10.0.0.2", 3100))


def test_an_ipv6_host_is_shown_in_brackets_and_reads_back_the_same():
    """Shown without its brackets ('aerospike://::1:3000/ns'), a URL `config` printed
    was refused when given back."""
    url = parse_url("aerospike://u:pw@[::1]:3100,[fe80::1]/ns")
    assert url.hosts == (("::1", 3100), ("fe80::1", 3000))
    assert str(url) == "aerospike://u:***@[::1]:3100,[fe80::1]:3000/ns"
    assert parse_url(str(url).replace("***", "pw")).hosts == url.hosts


def test_aerospike_port_defaults_to_3000():
    assert parse_url("aerospike://db/test").hosts == (("db", 3000),)


def test_embedded_file_and_memory():
    assert parse_url("embedded:///var/lib/aq/store.db").path == "/var/lib/aq/store.db"
    assert parse_url("embedded:///s.db?max_record_size=8388608").option("max_record_size") == "8388608"
    # The smallest aeroqueue works with (a server takes 64 bytes).
    assert parse_url("embedded:///s.db?max_record_size=131072").option("max_record_size") == "131072"
    mem = parse_url("embedded://:memory:")
    assert mem.is_embedded and mem.path == ":memory:" and mem.namespace == "test"


def test_default_is_the_embedded_store(monkeypatch, tmp_path):
    monkeypatch.delenv("AEROQUEUE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    url = resolve_url(None)
    assert url.is_embedded and url.path == str(tmp_path / "aeroqueue" / "store.db")
    assert default_store_path() == tmp_path / "aeroqueue" / "store.db"


def test_a_relative_xdg_data_home_is_ignored(monkeypatch, tmp_path):
    """The XDG spec: a relative path there is invalid and ignored. Used, it named a
    store that moved with the working directory, and one that `--url` refused."""
    monkeypatch.delenv("AEROQUEUE_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for relative in ("data", "./data", ""):
        monkeypatch.setenv("XDG_DATA_HOME", relative)
        assert default_store_path() == tmp_path / ".local" / "share" / "aeroqueue" / "store.db", relative
        assert resolve_url(None).path == str(default_store_path())
        assert parse_url(str(resolve_url(None))).path == str(default_store_path())  # a URL `--url` takes


def test_environment_variable_is_used(monkeypatch):
    monkeypatch.setenv("AEROQUEUE_URL", "aerospike://h:3000/ns1")
    assert resolve_url(None).namespace == "ns1"
    assert resolve_url("embedded://:memory:").is_embedded  # an explicit URL wins


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("localhost:3000/test", "missing scheme"),
        ("redis://h/test", "unknown scheme 'redis'"),
        ("aerospike:///test", "no host"),
        ("aerospike://h:3000", "no namespace"),
        ("aerospike://h:3000/", "no namespace"),
        ("aerospike://h:99999/test", "port '99999'"),
        ("aerospike://h:abc/test", "port 'abc'"),
        ("aerospike://h:3000,,g:3000/test", "empty host"),
        ("aerospike://h:3000/bad.ns", "namespace 'bad.ns'"),
        ("aerospike://h$x:3000/test", "host 'h$x'"),
        ("embedded://relative/store.db", "absolute file path"),
        ("embedded:///", "absolute file path"),
        ("embedded:///tmp/dir/", "names a directory"),
        ("embedded:///tmp/s.db?namespce=prod", "unknown option 'namespce' for an embedded store"),
        ("embedded://:memory:?namespace=a&namespace=b", "option 'namespace' is given twice"),
        ("embedded:///tmp/s.db?max_record_size=0", "option max_record_size='0' is not valid; it takes a number of bytes"),
        ("embedded:///tmp/s.db?max_record_size=-5", "option max_record_size='-5' is not valid"),
        ("embedded://:memory:?max_record_size=1MiB", "option max_record_size='1MiB' is not valid"),
        ("embedded://:memory:?max_record_size=8388609", "from 131072 (the least aeroqueue works with) to 8388608"),
        # A server takes it; an ack wrote the job done and not its bit (the list never complete).
        ("embedded://:memory:?max_record_size=131071", "option max_record_size='131071' is not valid"),
        ("embedded://:memory:?max_record_size=\u00b2", "option max_record_size='\u00b2' is not valid"),
        # Digits Python's isdigit() takes and int() does not, or reads as another number.
        ("aerospike://h:\u00b2/test", "port '\u00b2'"),
        ("aerospike://h:\u0663\u0660\u0660\u0660/test", "port '\u0663\u0660\u0660\u0660'"),
        ("aerospike://h/test?total_timeout=\u00b2", "option total_timeout='\u00b2' is not valid"),
        ("aerospike://h/test?socket_timeout=\u0661", "option socket_timeout='\u0661' is not valid"),
        # An IPv6 host's bracket unclosed, or followed by anything but :port.
        ("aerospike://[::1:3000/test", "host '[::1:3000' is not [IPv6 address] or [IPv6 address]:port"),
        ("aerospike://[::1]junk/test", "host '[::1]junk' is not [IPv6 address] or [IPv6 address]:port"),
    ],
)
def test_malformed_urls_name_the_wrong_part(text, names):
    with pytest.raises(InvalidURL) as e:
        parse_url(text)
    assert names in str(e.value)


def test_password_never_shown():
    url = parse_url("aerospike://admin:s3cret@h:3000/test")
    assert url.user == "admin" and url.password == "s3cret"
    assert "s3cret" not in str(url) and "s3cret" not in repr(url)
    for text in ("aerospike://admin:s3cret@h:99999/test", "aerospike://:s3cret@h:99999/test",
                 # an embedded URL has no use for credentials, but an error must not show them either
                 "embedded://admin:s3cret@/tmp/x.db", "embedded://admin:s3cret@/tmp/", "embedded://admin:s3cret@x.db",
                 "aerospike:/admin:s3cret@h:3000/test", "aerospike:admin:s3cret@h/test",
                 "aerospike://admin:s3cret@h:3000/te st"):
        with pytest.raises(InvalidURL) as e:
            parse_url(text)
        assert "s3cret" not in str(e.value), text


# A password holding '/', '@', '?' or '#' unencoded: the URL parses wrongly, and the
# pieces of the password land in the host, port, path or query the error names.
_UNENCODED = [
    ("aerospike://admin:s3/cr3t@h:3000/test", ("s3", "cr3t")),
    ("aerospike://admin:s3?cr3t@h:3000/test", ("s3", "cr3t")),
    ("aerospike://admin:s3#cr3t@h:3000/test", ("s3", "cr3t")),
    ("aerospike://admin:s3cr3t@h:99999/test?x=a@b", ("s3cr3t",)),
]


@pytest.mark.parametrize(("text", "pieces"), _UNENCODED)
def test_no_piece_of_an_unencoded_password_is_shown(text, pieces):
    with pytest.raises(InvalidURL) as e:
        parse_url(text)
    assert not any(p in str(e.value) for p in pieces), str(e.value)


@pytest.mark.parametrize("text", [t for t, _ in _UNENCODED[:3]])
def test_an_unencoded_password_is_told_to_be_percent_encoded(text):
    with pytest.raises(InvalidURL, match="must be percent-encoded"):
        parse_url(text)


@pytest.mark.parametrize(("text", "pieces"), [
    ("mysql://root:s3/cr3t@127.0.0.1:3306/test", ("s3", "cr3t")),
    ("mysql://root:s3?cr3t@127.0.0.1:3306/test", ("s3", "cr3t")),
    ("mysql://root:s3@cr3t@h:3306/bad-db", ("s3", "cr3t")),
    ("mysql://root:s3cr3t@h:99999/test", ("s3cr3t",)),
    # a blank in the password, a scheme typed with ':/' or ':', an option after '?'
    ("mysql://root:s3 cr3t@127.0.0.1:3306/bad-db", ("s3", "cr3t")),
    ("mysql:/root:s3cr3t@h/db", ("s3cr3t",)),
    ("mysql:root:s3cr3t@h/db", ("s3cr3t",)),
    ("root:s3cr3t@h/db", ("s3cr3t",)),
    ("mysql://root:s3 cr3t@h:3306/db?ssl=1", ("s3", "cr3t")),
])
def test_no_piece_of_a_sync_target_password_is_shown(text, pieces):
    from aeroqueue.errors import SyncError
    from aeroqueue.sync import parse_target

    with pytest.raises(SyncError) as e:
        parse_target(text)
    assert not any(p in str(e.value) for p in pieces), str(e.value)


def test_an_encoded_password_with_those_characters_is_read_as_given():
    from aeroqueue.sync import parse_target

    assert parse_url("aerospike://admin:s3%2F%40%3F%23@h:3000/test").password == "s3/@?#"
    assert parse_target("mysql://root:s3%2F%40%3F%23@h:3306/test").password == "s3/@?#"
    assert parse_url("aerospike://admin:s3@cr3t@h:3000/test").password == "s3@cr3t", "the last '@' ends it"


@pytest.mark.parametrize(("creds", "says"), [
    ("admin:s3%zzcr3t", "password holds a '%' that starts no percent-escape"),
    ("admin:s3cr3t%4", "password holds a '%' that starts no percent-escape"),
    ("admin:s3%00cr3t", "password holds a NUL"),
    ("admin:s3%FFcr3t", "password's percent-escapes are not UTF-8"),
    ("ad%zzmin:s3cr3t", "user name holds a '%'"),
    ("ad%00min:s3cr3t", "user name holds a NUL"),
])
def test_a_credential_no_server_would_read_as_meant_is_refused_unquoted(creds, says):
    """'%zz' was kept as it is and '%41' decoded, a NUL escape reached the client
    (which cuts the value there), bad UTF-8 became U+FFFD: each a password other
    than the one typed, refused at connect time as a wrong one, or not at all. The
    error says which and never shows the value."""
    from aeroqueue.errors import SyncError
    from aeroqueue.sync import parse_target

    with pytest.raises(InvalidURL, match=re.escape(says)) as e:
        parse_url(f"aerospike://{creds}@h:3000/test")
    with pytest.raises(SyncError, match=re.escape(says)) as f:
        parse_target(f"mysql://{creds}@h:3306/test")
    for err in (e, f):
        assert "s3" not in str(err.value) and "cr3t" not in str(err.value), str(err.value)
    assert parse_url("aerospike://admin:100%25%C3%A9@h:3000/test").password == "100%\u00e9"
    assert parse_target("mysql://root:100%25@h:3306/test").password == "100%"


@pytest.mark.parametrize("text", [
    "aerospike://h:3000/test?total_timeout=5&tls_name=a@b",  # '@' in a query of host:port: the query's own
    "aerospike://[::1]:3000/test",
    "aerospike://h1:3000,h2:3000/test",
])
def test_an_at_sign_outside_the_credentials_is_not_taken_for_a_password(text):
    assert parse_url(text).password is None


@pytest.mark.parametrize("url", [
    "aerospike://127.0.0.1:3000/test?password=Hunter2",
    "aerospike://127.0.0.1:3000/test?total_timeout=5&pwd=Hunter2",
    "embedded:///tmp/s.db?secret=Hunter2",
    "aerospike://127.0.0.1:3000/test?password=Hunter2&&x",  # malformed: its own message
    "aerospike://127.0.0.1:3000/test?password=Hun%26ter2",  # an encoded '&' decoded ended the mask early
])
def test_a_secret_given_as_a_url_option_is_masked_in_the_error(url):
    """Credentials go before the host; one given as ?password=... was refused with the
    URL quoted whole, password and all (a helper's walk)."""
    with pytest.raises(InvalidURL) as refused:
        parse_url(url)
    assert "Hunter2" not in str(refused.value) and "***" in str(refused.value), str(refused.value)
    assert "Hunter2" not in mask_url(url) and "Hunter2" not in mask_passwords(f"error: {url} failed")
    assert "ter2" not in str(refused.value)


def test_what_is_not_a_url_keeps_its_query_and_free_text_masks_secret_parameters():
    assert mask_url("jobs?v=2.csv") == "jobs?v=2.csv"  # a file name, a job id: not a URL
    said = mask_passwords("x ?password='a b' &pw=z &X-Amz-Credential=abc&sig=q&total_timeout=5")
    assert said == "x ?password=*** &pw=*** &X-Amz-Credential=***&sig=***&total_timeout=5", said


def test_a_user_name_holding_an_at_sign_keeps_its_password_masked():
    from aeroqueue.errors import SyncError
    from aeroqueue.sync import parse_target

    with pytest.raises(SyncError) as e:
        parse_target("mysql://me@corp.com:s3cr3t@h:3306/bad-db")  # Azure: user@server
    assert "s3cr3t" not in str(e.value) and "me@corp.com:***@h" in str(e.value)


def test_a_store_url_shown_keeps_its_user_encoded_and_masks_only_a_password():
    """`config` showed 'aerospike://us:er:***@...' for the user 'us:er' (given as
    us%3Aer), which reads as user 'us' and a password; and 'admin:***@' for a URL
    without a password, implying one."""
    assert str(parse_url("aerospike://us%3Aer:pw@127.0.0.1:3801/test")) == "aerospike://us%3Aer:***@127.0.0.1:3801/test"
    assert str(parse_url("aerospike://admin@127.0.0.1:3801/test")) == "aerospike://admin@127.0.0.1:3801/test"
    assert str(parse_url("aerospike://admin:pw@127.0.0.1:3801/test")) == "aerospike://admin:***@127.0.0.1:3801/test"
