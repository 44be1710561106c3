"""Redis: the reliable-queue pattern, LMOVE into a per-worker processing list, LREM to ack.

Each worker moves a job from the queue to its own processing list
atomically, so a job is never only in a client's memory: a reaper can push a
dead worker's processing list back (the worker registers its list in a set
for that). The ack removes the job from the processing list; LREM answering
1 means this worker still held it. The batch form is a pipeline of LMOVEs and
a pipeline of LREMs: one round trip each, every command still atomic.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .harness import Peer, PeerInfo, PeerUnavailable, Prepared, Worker

DEFAULT_URL = "redis://127.0.0.1:6379/0"
LOAD_CHUNK = 1000  # RPUSH arguments per command when loading


class RedisWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import redis

        self.r = redis.Redis.from_url(config["url"])
        self.queue = config["queue"]
        self.processing = f"{config['prefix']}:processing:{uuid.uuid4().hex}"
        # Where a reaper finds this worker's processing list if it dies.
        self.r.sadd(config["workers"], self.processing)

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        self.calls += 1
        if n == 1:
            one = self.r.lmove(self.queue, self.processing, "LEFT", "RIGHT")
            raw = [one] if one is not None else []
        else:
            pipe = self.r.pipeline(transaction=False)
            for _ in range(n):
                pipe.lmove(self.queue, self.processing, "LEFT", "RIGHT")
            raw = [v for v in pipe.execute() if v is not None]
        return [(json.loads(v)["id"], v) for v in raw]

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        self.calls += 1
        if len(jobs) == 1:
            removed = [self.r.lrem(self.processing, 1, jobs[0][1])]
        else:
            pipe = self.r.pipeline(transaction=False)
            for _, raw in jobs:
                pipe.lrem(self.processing, 1, raw)
            removed = pipe.execute()
        accepted = [number for (number, _), n in zip(jobs, removed, strict=True) if n == 1]
        self.lost += len(jobs) - len(accepted)
        return accepted

    def close(self) -> None:
        self.r.close()


class RedisPeer(Peer):
    name = "redis"
    batch_form = "pipeline of 100 LMOVEs, pipeline of LREMs"

    def __init__(self, url: str = DEFAULT_URL) -> None:
        self.url = url
        self.r: Any = None

    def start(self) -> PeerInfo:
        try:
            import redis
        except ImportError:
            raise PeerUnavailable("the redis package is not installed (pip install redis)") from None
        try:
            self.r = redis.Redis.from_url(self.url, socket_connect_timeout=3)
            server = self.r.info("server")
            persistence = self.r.info("persistence")
        except redis.RedisError as e:
            raise PeerUnavailable(f"cannot reach Redis at {self.target()}: {e}") from None
        version = str(server.get("redis_version", "0"))
        if tuple(int(x) for x in version.split(".")[:2]) < (6, 2):
            raise PeerUnavailable(f"Redis {version} has no LMOVE (6.2 or later is needed)")
        return PeerInfo(
            name=self.name,
            version=f"Redis {version}, redis-py {redis.__version__}",
            target=self.target(),
            recipe=(
                "LMOVE queue -> per-worker processing list; ack = LREM from it (1: still held); "
                "a dead worker's processing list must be pushed back by a reaper"
            ),
            durability=self._durability(persistence),
        )

    def target(self) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        return f"redis://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"

    def _durability(self, persistence: dict[str, Any]) -> str:
        aof = bool(int(persistence.get("aof_enabled", 0)))
        try:
            save = self.r.config_get("save").get("save", "")
            fsync = self.r.config_get("appendfsync").get("appendfsync", "?")
        except Exception:  # CONFIG can be renamed away on managed servers
            save, fsync = "?", "?"
        if aof:
            return f"AOF on, appendfsync {fsync}" + (f", RDB snapshots '{save}'" if save else "")
        if save:
            return f"AOF off; RDB snapshots '{save}': writes since the last snapshot are lost on a crash"
        return "no persistence (AOF off, no RDB snapshots): a restart loses every job"

    def prepare(self, n_jobs: int) -> Prepared:
        prefix = f"aq_bench:{uuid.uuid4().hex[:10]}"
        queue = f"{prefix}:queue"
        pipe = self.r.pipeline(transaction=False)
        for lo in range(0, n_jobs, LOAD_CHUNK):
            pipe.rpush(queue, *(json.dumps({"id": i, "payload": {"i": i}}) for i in range(lo, min(lo + LOAD_CHUNK, n_jobs))))
            if len(pipe) >= 50:
                pipe.execute()
        pipe.execute()
        return Prepared(
            RedisWorker,
            {"url": self.url, "prefix": prefix, "queue": queue, "workers": f"{prefix}:workers"},
            n_jobs,
        )

    def verify(self, prepared: Prepared, acked: int) -> str | None:
        problems = []
        left = int(self.r.llen(prepared.config["queue"]))
        if left != prepared.jobs - acked:
            problems.append(f"{left} jobs left in the queue, {prepared.jobs - acked} expected")
        held = sum(int(self.r.llen(k)) for k in self.r.smembers(prepared.config["workers"]))
        if held:
            problems.append(f"{held} jobs still in processing lists")
        return "; ".join(problems) or None

    def discard(self, prepared: Prepared) -> None:
        doomed = list(self.r.scan_iter(match=f"{prepared.config['prefix']}:*", count=1000))
        for lo in range(0, len(doomed), 1000):
            self.r.delete(*doomed[lo : lo + 1000])

    def stop(self) -> None:
        if self.r is not None:
            self.r.close()
            self.r = None
