"""A TCP relay on loopback that delays the data each way by half a round trip.

    python bench/delay_relay.py LISTEN_PORT UPSTREAM_PORT ROUND_TRIP_SECONDS

Loopback answers in a fraction of a millisecond, so a 429 comes back before
the crawler's next send; over the Internet it comes back tens of
milliseconds later, after slow start has stepped on. This puts that round
trip between a crawl and a limiter: every chunk is forwarded, in order, half
the round trip after it was read (the connection's set-up is not delayed).
"""

from __future__ import annotations

import asyncio
import sys


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        while True:
            when, chunk = await due.get()
            if when > loop.time():
                await asyncio.sleep(when - loop.time())
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(forward())
    try:
        while chunk := await reader.read(65536):
            due.put_nowait((loop.time() + delay, chunk))
    except ConnectionError:
        pass
    due.put_nowait((loop.time() + delay, b""))
    try:
        await sender
    except ConnectionError:
        pass


async def main(listen: int, upstream: int, round_trip: float) -> None:
    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, server_writer, round_trip / 2),
                             pump(server_reader, client_writer, round_trip / 2))

    server = await asyncio.start_server(relay, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
