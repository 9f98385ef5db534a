"""What authentication costs a request, and what a flood of wrong passwords does to others.

One server runs with authentication off, one with it on (admin ``bench`` created by the
bootstrap settings). Four keep-alive clients read ``GET /v1/queues/QUEUE`` for 5 s (``--quick``:
2 s) on each: without credentials (auth off), with Basic (a cached check after the first
request), and with a bearer token. Then 8 clients send wrong Basic passwords for the same time
while one client keeps reading with a token: wrong logins answered per second, how many of them
were checked (401: one scrypt each, at most two at a time) and how many were refused by the
failed-login limit without a hash (429), and the token client's p99 latency during the flood.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp

from benchmarks.client import QUEUE, new_session, put_queue
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.server import running_server
from benchmarks.settings import Settings

CLIENTS = 4
ATTACKERS = 8
PASSWORD = "bench-password"
BASIC = aiohttp.BasicAuth("bench", PASSWORD)
PATH = f"/v1/queues/{QUEUE}"


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    seconds = 2.0 if settings.quick else 5.0
    async with running_server(settings.data_dir("auth-off"), settings.log_path("auth-off")) as server:
        async with new_session() as session:
            await put_queue(session, server.url)
        off = await requests_per_second(server.url, {}, seconds)
    config = settings.work_dir / "auth.toml"
    config.write_text(
        '[auth]\nenabled = true\nbootstrap_user = "bench"\n'
        'bootstrap_password_env = "CAPELLA_BENCH_PASSWORD"\n'
    )
    os.environ["CAPELLA_BENCH_PASSWORD"] = PASSWORD
    async with running_server(settings.data_dir("auth-on"), settings.log_path("auth-on"), config) as server:
        basic = {"Authorization": BASIC.encode()}
        async with new_session() as session:
            async with session.put(f"{server.url}{PATH}", json={}, headers=basic) as resp:
                if resp.status not in (200, 201):
                    raise BenchmarkFailed(f"PUT queue: HTTP {resp.status}")
            async with session.post(f"{server.url}/v1/tokens", json={}, headers=basic) as resp:
                token = (await resp.json())["token"]
        bearer = {"Authorization": f"Bearer {token}"}
        with_basic = await requests_per_second(server.url, basic, seconds)
        with_token = await requests_per_second(server.url, bearer, seconds)
        flood = await under_flood(server.url, bearer, seconds)
    scenario = "auth"
    ratio = f"{with_basic / off:.0%} of off"
    outcome.rows += [
        Row(scenario, "GET queue, auth off", off, "req/s", note=f"{CLIENTS} clients"),
        Row(scenario, "GET queue, Basic (cached)", with_basic, "req/s", note=ratio),
        Row(scenario, "GET queue, token", with_token, "req/s", note=f"{with_token / off:.0%} of off"),
        Row(
            scenario,
            "wrong Basic logins answered",
            flood["failed_per_s"],
            "login/s",
            note=f"{ATTACKERS} attackers; 401 {flood['hashed']}, 429 {flood['limited']}",
        ),
        Row(
            scenario,
            "token GET p99 during the flood",
            flood["p99_ms"],
            "ms",
            higher_is_better=False,
            note=f"p50 {flood['p50_ms']:.1f} ms",
        ),
    ]
    outcome.details["auth"] = {"off": off, "basic": with_basic, "token": with_token, "flood": flood}
    return outcome


async def requests_per_second(base: str, headers: dict[str, str], seconds: float) -> float:
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()

    async def client() -> int:
        done = 0
        async with new_session() as session:
            while time.perf_counter() < deadline:
                async with session.get(f"{base}{PATH}", headers=headers) as resp:
                    if resp.status != 200:
                        raise BenchmarkFailed(f"GET queue: HTTP {resp.status}")
                    await resp.read()
                done += 1
        return done

    counts = await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return sum(counts) / (time.perf_counter() - started)


async def under_flood(base: str, headers: dict[str, str], seconds: float) -> dict[str, Any]:
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    wrong = {"Authorization": aiohttp.BasicAuth("bench", "wrong-password").encode()}

    answers: dict[int, int] = {401: 0, 429: 0}

    async def attacker() -> int:
        failed = 0
        async with new_session() as session:
            while time.perf_counter() < deadline:
                async with session.get(f"{base}{PATH}", headers=wrong) as resp:
                    # 401: checked (identical wrong logins in flight share one hash); 429: limited, no hash.
                    if resp.status not in answers:
                        raise BenchmarkFailed(f"a wrong password got HTTP {resp.status}")
                    answers[resp.status] += 1
                    await resp.read()
                failed += 1
        return failed

    async def reader() -> list[float]:
        latencies = []
        async with new_session() as session:
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                async with session.get(f"{base}{PATH}", headers=headers) as resp:
                    await resp.read()
                latencies.append((time.perf_counter() - sent) * 1000)
                await asyncio.sleep(0.01)
        return latencies

    *failed, latencies = await asyncio.gather(*(attacker() for _ in range(ATTACKERS)), reader())
    stats = summary(latencies)
    return {
        "failed_per_s": sum(failed) / (time.perf_counter() - started),
        "hashed": answers[401],
        "limited": answers[429],
        "p50_ms": stats["p50"],
        "p99_ms": stats["p99"],
        "reads": len(latencies),
    }
