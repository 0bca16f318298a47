"""Reaching Redis in any of its topologies: one server, a primary that Sentinel names, or a Cluster.

`state.url` says which, by its scheme:

    redis://host:6379/0 (rediss://, unix://)         one server
    redis+sentinel://s1:26379,s2:26379/mymaster/0    the primary the sentinels name `mymaster`, database 0
    redis+cluster://n1:7000,n2:7001                  a cluster, found from any of these seed nodes

(`rediss+sentinel://` and `rediss+cluster://` speak TLS to the data nodes, `?ssl_ca_certs=` naming
their CA where it is not the system's.) A user and password
in the URL are the data nodes'; a Sentinel with a password of its own takes `?sentinel_password=`.
Every user of shared state gets its client here, so all of them follow a failover or a slot
move the same way: redis-py's Sentinel pool asks the sentinels for the primary on each new
connection, and its cluster client follows MOVED and ASK answers.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import parse_qsl, unquote, urlsplit

if TYPE_CHECKING:  # the client is imported when one is made: the config check needs only parse()
    import redis.asyncio as aioredis

RedisClient = Union["aioredis.Redis", "aioredis.RedisCluster"]


class Mode(enum.Enum):
    SINGLE = "single"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


@dataclass(slots=True, frozen=True)
class Topology:
    """What a `state.url` names; its repr leaves the password out."""

    mode: Mode
    nodes: tuple[tuple[str, int], ...] = ()  # SENTINEL: the sentinels; CLUSTER: seeds
    master: str = ""  # SENTINEL: the primary's name
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None  # TLS: the CA the data nodes' certificates chain to


def parse(url: str) -> Topology:
    """The topology `url` names; ValueError (never quoting a password) when it names none."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("not a URL: expected redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://")
    scheme = scheme.lower()
    if scheme in ("redis", "rediss", "unix"):
        _check_single(url)
        return Topology(Mode.SINGLE)
    base, _, kind = scheme.partition("+")
    if base not in ("redis", "rediss") or kind not in ("sentinel", "cluster"):
        raise ValueError(
            f"unknown scheme {scheme!r}: expected redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://"
        )
    # The user part first, up to the last `@`: a password's own `?`, `/` or `#` stays in it, and no
    # part of it can be read as a host or a port (and quoted in an error).
    userinfo, at, rest = rest.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    if "#" in rest:
        raise ValueError(_NO_FRAGMENT)
    rest, _, query = rest.partition("?")
    hosts, _, path = rest.partition("/")
    nodes = tuple(_node(h, 26379 if kind == "sentinel" else 6379) for h in hosts.split(","))
    segments = [unquote(s) for s in path.split("/") if s]
    options = {"sentinel_password": None, "ssl_ca_certs": None}
    for pair in filter(None, query.split("&")):
        name, _, value = pair.partition("=")
        allowed = ("sentinel_password",) * (kind == "sentinel") + ("ssl_ca_certs",) * (base == "rediss")
        if name not in allowed:
            raise ValueError(
                f"{_unknown(name, query)}: a sentinel URL takes sentinel_password, a "
                "rediss+ URL ssl_ca_certs, and nothing else"
            )
        options[name] = unquote(value)  # not form-decoded: a `+` is a `+`, as in the user part
    sentinel_password, ca_file = options["sentinel_password"], options["ssl_ca_certs"]
    if kind == "cluster":
        if segments not in ([], ["0"]):
            raise ValueError("a cluster has only database 0: redis+cluster://host:port[,host:port...]")
        return Topology(
            Mode.CLUSTER, nodes, username=username, password=password, tls=base == "rediss", ca_file=ca_file
        )
    if not segments or len(segments) > 2 or not segments[0] or (len(segments) == 1 and segments[0].isdigit()):
        # (a lone number is a database whose primary's name was left out, far likelier than a name)
        raise ValueError("a sentinel URL names the primary: redis+sentinel://host:port[,host:port...]/name[/db]")
    db = segments[1] if len(segments) == 2 else "0"
    if not (db.isascii() and db.isdigit() and int(db) < 2**31):
        raise ValueError("the database is not a number")
    return Topology(
        Mode.SENTINEL, nodes, segments[0], int(db), username, password, sentinel_password, base == "rediss", ca_file
    )


def _node(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):  # [::1]:7000
        host, bracket, after = text[1:].partition("]")
        if not bracket:
            raise ValueError("a bracketed address without its ]")
        if after and not after.startswith(":"):
            raise ValueError("after a bracketed address comes :port or nothing")
        port = after.removeprefix(":")
    else:
        host, colon, port = text.partition(":")
        if ":" in port:
            raise ValueError("an IPv6 address goes in brackets: [::1]:7000")
        if colon and not port:
            raise ValueError("a node with an empty port")
    if not host:
        raise ValueError("an empty host in the node list")
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError("a port that is not a number from 1 to 65535")
    return host, int(port) if port else default_port


_NO_FRAGMENT = "a state URL has no #fragment (a # in a password is written %23)"
_OPTION_NAME = re.compile(r"[a-z][a-z_]{0,39}")


def _unknown(name: str, query: str) -> str:
    """'unknown option ...', quoting the name only when it cannot be a piece of a password: a
    password option's value holding a `&` is cut there, and what follows reads as a name."""
    if _OPTION_NAME.fullmatch(name) and "password" not in query.lower():
        return f"unknown option {name!r}"
    if not name:
        return "an option with no name"
    return (
        "an unknown option (not quoted: it may be part of a password; a & or = in a password "
        "option is written %26 or %3D)"
    )


def _check_single(url: str) -> None:
    """What redis-py would take silently or fail on only at start: a bad port, a database that is
    no number, a password that its URL parser would cut, a query option it cannot read."""
    after_netloc = re.split(r"[/?#]", url.partition("://")[2], maxsplit=1)[1:]
    if after_netloc and "@" in after_netloc[0]:
        # Where a password holds / ? or #, redis-py's parser ends the host part there: what follows
        # would be taken for a path, a query or a fragment (and quoted in their errors).
        raise ValueError(
            "an @ after the host part: a / ? # or @ in a user or password is written "
            "%2F %3F %23 %40 (and an @ in an option's value %40)"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (read for its check: out of range or not a number raises)
    except ValueError:
        raise ValueError("a port that is not a number from 1 to 65535") from None
    if parts.fragment or url.endswith("#"):
        raise ValueError(_NO_FRAGMENT)
    db = parts.path.strip("/") if parts.scheme != "unix" else ""
    if db and not (db.isascii() and db.isdigit()):
        raise ValueError("the database is not a number")
    _check_options(parts.query, tls=parts.scheme == "rediss")


# The query options of a one-server URL that redis-py reads, each with what its value must be.
# redis-py fails on a value it cannot read only when it first connects (a traceback at start),
# takes an unknown name as a keyword its connections then refuse, and reads any word but a few as
# true: here each is checked when the config is.
_SECONDS = ("socket_timeout", "socket_connect_timeout", "timeout")
_WHOLE = ("db", "health_check_interval")
_YES_NO = ("socket_keepalive", "retry_on_timeout")
_TEXT = ("client_name",)
_ONE_SERVER = (*_SECONDS, *_WHOLE, *_YES_NO, *_TEXT)
_TLS_PATHS = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")
_TLS = ("ssl_check_hostname", "ssl_cert_reqs", *_TLS_PATHS)
_WORDS = frozenset(("true", "false", "yes", "no", "y", "n", "t", "f", "1", "0"))  # each read as it says


def _check_options(query: str, tls: bool) -> None:
    seen: set[str] = set()
    for name, value in parse_qsl(query, keep_blank_values=True):  # decoded as redis-py decodes them
        if name not in _ONE_SERVER and not (tls and name in _TLS):
            raise ValueError(
                f"{_unknown(name, query)}: a redis:// or unix:// URL takes {', '.join(_ONE_SERVER)}; "
                f"a rediss:// URL also {', '.join(_TLS)}"
            )
        if name in seen:
            raise ValueError(f"option {name} given twice")
        seen.add(name)
        if name in _SECONDS and not _positive_number(value):
            raise ValueError(f"option {name}: not a number of seconds above 0")
        if name in _WHOLE and not (value.isascii() and value.isdigit() and int(value) < 2**31):
            raise ValueError(f"option {name}: not a whole number")
        if name in (*_YES_NO, "ssl_check_hostname") and value.lower() not in _WORDS:
            raise ValueError(f"option {name}: not one of true, false, yes, no, y, n, t, f, 1, 0")
        if name == "ssl_cert_reqs" and value not in ("none", "optional", "required"):
            raise ValueError("option ssl_cert_reqs: not one of none, optional, required")
        if name in (*_TEXT, *_TLS_PATHS) and not value:
            raise ValueError(f"option {name}: empty")


def _positive_number(text: str) -> bool:
    try:
        return 0 < float(text) < math.inf
    except ValueError:
        return False


# Commands in flight at once, per client: past it a command waits its turn. redis-py's pools
# refuse a connection past their size at once (an error the limiter would take for an outage,
# and fail open on, under a burst); the pools get a few more, for the pipelines that bypass this.
MAX_IN_FLIGHT = 256
_POOL_SLACK = 32


def connect(url: str, **options: Any) -> RedisClient:
    """A client for the topology `url` names. `options` are redis-py's connection options
    (socket_timeout, decode_responses, ...), applied to every data node."""
    from proxy.state.packing import packing_with_hiredis

    topology = parse(url)
    options["max_connections"] = MAX_IN_FLIGHT + _POOL_SLACK
    # redis-py's cluster client retries a timed-out command whatever its Retry names: there, none.
    options.setdefault("retry", no_retry() if topology.mode is Mode.CLUSTER else _quick_retry())
    classes = _clients()
    if topology.ca_file:
        options["ssl_ca_certs"] = topology.ca_file
    if topology.mode is Mode.SINGLE:
        client = classes.single.from_url(url, **options)
    elif topology.mode is Mode.CLUSTER:
        from redis.asyncio.cluster import ClusterNode

        options.pop("health_check_interval", None)  # the cluster client checks its nodes itself
        client = classes.cluster(
            startup_nodes=[ClusterNode(h, p) for h, p in topology.nodes],
            ssl=topology.tls,
            username=topology.username,
            password=topology.password,
            **options,
        )
    else:
        from redis.asyncio.sentinel import Sentinel

        # Each sentinel is asked once: the next one is the retry (redis-py's default would back
        # off for seconds on a dead sentinel before asking another).
        sentinel_options: dict[str, Any] = {k: v for k, v in options.items() if k.startswith("socket_")}
        sentinel_options["retry"] = no_retry()
        if topology.sentinel_password:
            sentinel_options["password"] = topology.sentinel_password
        sentinel = Sentinel(list(topology.nodes), sentinel_kwargs=sentinel_options)
        client = sentinel.master_for(
            topology.master,
            redis_class=classes.single,
            db=topology.db,
            ssl=topology.tls,
            username=topology.username,
            password=topology.password,
            **options,
        )
        client.sentinels = sentinel.sentinels
    if topology.mode is Mode.CLUSTER:  # the kwargs each node's connections are made with, found or yet to be
        made_with = client.connection_kwargs
        made_with["connection_class"] = packing_with_hiredis(made_with["connection_class"])
    else:
        pool = client.connection_pool
        pool.connection_class = packing_with_hiredis(pool.connection_class)
    client.gate = asyncio.Semaphore(MAX_IN_FLIGHT)
    return client


def mode_of(url: str) -> Mode:
    return parse(url).mode


def _quick_retry() -> Any:
    """Twice more, within a tenth of a second, and only when a connection failed: redis-py's own
    default backs off for seconds and resends timed-out commands too, holding a request through
    a whole failover (the fail mode and the client's retry answer that better)."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError

    return Retry(ExponentialBackoff(cap=0.05, base=0.01), 2, supported_errors=(ConnectionError,))


def no_retry() -> Any:
    """Never resent: for calls that must not run twice (the limiter's scripts), and for the
    cluster client, which would resend after a timeout too."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Retry(NoBackoff(), 0)


@dataclass(slots=True, frozen=True)
class _Classes:
    single: type
    cluster: type


@functools.cache
def _clients() -> _Classes:
    """redis-py's clients, gated (MAX_IN_FLIGHT); built on first use, so only a gateway that
    talks to Redis imports it."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterPipeline, RedisCluster
    from redis.exceptions import ConnectionError, RedisClusterException

    class Gated(aioredis.Redis):
        gate: asyncio.Semaphore
        sentinels: list[aioredis.Redis] = []  # a Sentinel-named primary's: closed with it

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            async with self.gate:
                return await super().execute_command(*args, **options)

        async def aclose(self, close_connection_pool: bool | None = None) -> None:
            await super().aclose(close_connection_pool)
            for sentinel in self.sentinels:
                await sentinel.aclose()

    # redis-py's cluster client reports some failures of its own (no node answers, a slot no node
    # serves) as RedisClusterException, which is no RedisError: raised as a ConnectionError
    # instead, they meet every caller's handling of a store that is away.
    class CheckedClusterPipeline(ClusterPipeline):
        async def execute(self, *args: Any, **options: Any) -> Any:
            try:
                return await super().execute(*args, **options)
            except RedisClusterException as exc:
                raise ConnectionError(str(exc)) from exc

    class GatedCluster(RedisCluster):
        gate: asyncio.Semaphore
        found: asyncio.Lock | None = None

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            try:
                await self._find_nodes()
                async with self.gate:
                    return await super().execute_command(*args, **options)
            except RedisClusterException as exc:
                raise ConnectionError(str(exc)) from exc

        async def node_for(self, key: str) -> Any:
            """The primary that holds `key`'s slot now."""
            try:
                await self._find_nodes()
                return self.get_node_from_key(key)
            except RedisClusterException as exc:
                raise ConnectionError(str(exc)) from exc

        async def _find_nodes(self) -> None:
            if self._initialize:
                # The nodes are found once, by one command, while the others wait: redis-py lets a
                # burst of first commands each start finding them, and closes connections that the
                # others are still using.
                self.found = self.found or asyncio.Lock()
                async with self.found:
                    await self.initialize()

        def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
            if shard_hint:
                raise ValueError("a cluster pipeline takes no shard hint")
            return CheckedClusterPipeline(self, transaction)

    return _Classes(Gated, GatedCluster)
