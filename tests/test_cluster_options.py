"""The client options an aerospike:// store URL takes for clusters: parsed, checked,
and turned into the client's configuration. (On a real cluster: tests/multinode.)"""

from __future__ import annotations

import time

import aerospike
import pytest

from aeroqueue.backends import client_config, open_backend
from aeroqueue.config import CLIENT_OPTIONS, parse_url
from aeroqueue.errors import BackendError, InvalidURL

SEEDS = "aerospike://10.0.0.1:3000,10.0.0.2:3000/prod"


def test_options_are_typed():
    url = parse_url(
        SEEDS + "?connect_timeout=500&total_timeout=2000&socket_timeout=0&min_conns_per_node=4"
        "&max_conns_per_node=64&use_services_alternate=yes&cluster_name=prod-eu&tls_name=db.example"
    )
    assert url.client_options() == {
        "connect_timeout": 500, "total_timeout": 2000, "socket_timeout": 0, "min_conns_per_node": 4,
        "max_conns_per_node": 64, "use_services_alternate": True, "cluster_name": "prod-eu", "tls_name": "db.example",
    }
    assert str(url).endswith("/prod?connect_timeout=500&total_timeout=2000&socket_timeout=0&min_conns_per_node=4"
                             "&max_conns_per_node=64&use_services_alternate=yes&cluster_name=prod-eu&tls_name=db.example")


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("timeout=5", "unknown option 'timeout'; the options are cluster_name, connect_timeout,"),
        ("total_timeout=1s", "option total_timeout='1s' is not valid; it takes milliseconds"),
        ("socket_timeout=-1", "option socket_timeout='-1' is not valid"),
        ("connect_timeout=0", "option connect_timeout='0' is not valid; it takes milliseconds, more than 0"),
        ("min_conns_per_node=many", "option min_conns_per_node='many' is not valid; it takes a count"),
        ("max_conns_per_node=0", "option max_conns_per_node='0' is not valid"),
        ("min_conns_per_node=200", "min_conns_per_node=200 is more than max_conns_per_node=100"),
        ("min_conns_per_node=8&max_conns_per_node=4", "min_conns_per_node=8 is more than max_conns_per_node=4"),
        ("use_services_alternate=maybe", "option use_services_alternate='maybe' is not valid; it takes true or false"),
        ("tls_name=", "option tls_name='' is not valid"),
        ("tls_cafile=/nonexistent/ca.pem", "option tls_cafile='/nonexistent/ca.pem': no such file"),
        ("total_timeout=5&total_timeout=6", "option 'total_timeout' is given twice"),
    ],
)
def test_bad_options_are_refused_naming_the_option(query, says):
    with pytest.raises(InvalidURL) as e:
        parse_url(f"aerospike://u:s3cret@h:3000/test?{query}")
    assert says in str(e.value)
    assert "s3cret" not in str(e.value)


def test_every_option_is_documented_in_the_readme():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    missing = [name for name in CLIENT_OPTIONS if f"`{name}`" not in readme]
    assert not missing, f"options the README does not name: {missing}"


def test_a_password_may_hold_url_characters_when_percent_encoded():
    url = parse_url("aerospike://app:p%40ss%2Fw%3Ard@h:3000/test")
    assert (url.user, url.password) == ("app", "p@ss/w:rd")
    assert "p@ss" not in str(url)


def test_the_client_configuration():
    url = parse_url(SEEDS + "?total_timeout=2000&socket_timeout=300&connect_timeout=700&min_conns_per_node=2"
                    "&use_services_alternate=true&cluster_name=prod")
    config = client_config(url)
    assert config["hosts"] == [("10.0.0.1", 3000), ("10.0.0.2", 3000)]
    # Start with whichever seeds answer (the client's default refuses if any seed is down).
    assert config["fail_if_not_connected"] is False
    policies = config["policies"]
    for name in ("read", "write", "apply", "operate", "remove", "batch", "batch_parent_write"):
        assert (policies[name]["total_timeout"], policies[name]["socket_timeout"]) == (2000, 300), name
    assert policies["info"] == {"timeout": 2000}
    for name in ("write", "apply", "operate"):  # never a silent client retry of a write
        assert policies[name]["max_retries"] == 0
    # While partitions migrate (a split healing), reads consult every copy, not a stale one.
    for name in ("read", "batch", "operate"):
        assert policies[name]["read_mode_ap"] == aerospike.POLICY_READ_MODE_AP_ALL, name
    assert (config["connect_timeout"], config["min_conns_per_node"], config["use_services_alternate"],
            config["cluster_name"]) == (700, 2, True, "prod")
    assert "tls" not in config and "user" not in config


def test_tls_and_credentials_reach_the_client(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = client_config(parse_url(f"aerospike://app:pw@a:4333,b:4333/test?tls_name=cluster.example&tls_cafile={ca}"))
    assert config["hosts"] == [("a", 4333, "cluster.example"), ("b", 4333, "cluster.example")]
    assert config["tls"] == {"enable": True, "cafile": str(ca)}
    assert (config["user"], config["password"]) == ("app", "pw")
    assert client_config(parse_url("aerospike://a:4333/test?tls_cafile=" + str(ca)))["tls"]["enable"] is True


def test_no_seed_answering_is_one_clear_error_quickly():
    # Nothing listens on these loopback ports: every seed refuses at once.
    t = time.monotonic()
    with pytest.raises(BackendError) as e:
        open_backend("aerospike://127.0.0.1:1,127.0.0.1:2/test?connect_timeout=300")
    text = str(e.value)
    assert text.startswith("cannot connect to aerospike://127.0.0.1:1,127.0.0.1:2/test?connect_timeout=300 "
                           "through any of its 2 seeds: "), text
    assert isinstance(e.value.__cause__, aerospike.exception.AerospikeError)
    assert time.monotonic() - t < 5


def test_a_server_of_another_cluster_name_is_said_to_be_one_possibility(real_url):
    """The client refuses a seed of another cluster with "Failed to connect" only, and
    the hint asked whether the server was running: a user who had a running server and
    a wrong cluster_name looked at the network (a README walk-through)."""
    with pytest.raises(BackendError) as e:
        open_backend(real_url + ("&" if "?" in real_url else "?") + "cluster_name=not-this-one&connect_timeout=500")
    assert e.value.hint == (  # type: ignore[attr-defined]
        "is the server running and reachable, and is its cluster name 'not-this-one' (cluster_name)? "
        "check --url or AEROQUEUE_URL")
    open_backend(real_url).close()  # the same server, its name not asked: it answers
