import asyncio, os, sys, nats
from nats.js import api
async def main():
    nc = await nats.connect("nats://127.0.0.1:14333"); js = nc.jetstream()
    await js.add_stream(name="bench", subjects=["bench"], storage=api.StorageType.FILE)
    def st():
        f = open(f"/proc/{sys.argv[1]}/stat").read().rpartition(")")[2].split(); return int(f[11]), int(f[12])
    a = st()
    payload = os.urandom(128).hex().encode()
    for b in range(100):
        futs = [await js.publish_async("bench", payload) for _ in range(100)]
        await asyncio.gather(*futs)
    b = st(); print("utime us/msg", (b[0]-a[0])*1e4/10000, "stime us/msg", (b[1]-a[1])*1e4/10000)
    await nc.close()
asyncio.run(main())
