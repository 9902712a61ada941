"""A TCP relay that adds a one-way delay in each direction: a test fixture
that injects what loopback cannot produce on demand (netem is not available
here) — the latency between regions. Each relay listens on 127.0.0.1 and
forwards to one target; the delay can be changed while it runs, and the
relay can be told to refuse new connections (a region that vanished).

Runs an asyncio loop in a background thread of the test process:

    relay = DelayRelay(target_port, delay_ms=25)
    relay.port            # where to connect
    relay.set_delay(60)   # applies to data read from now on
    relay.close()
"""
import asyncio
import atexit
import socket
import threading
import time


class DelayRelay:
    def __init__(self, target_port, delay_ms, target_host="127.0.0.1"):
        self.target = (target_host, target_port)
        self.delay = delay_ms / 1000.0
        self.refuse = False
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server = None
        self._writers = set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("delay relay did not start")
        atexit.register(self.close)

    def _run(self):
        asyncio.set_event_loop(self._loop)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, sock=sock))
        self._ready.set()
        self._loop.run_forever()
        # Stopped: end the pipes still open, so none is destroyed pending.
        tasks = asyncio.all_tasks(self._loop)
        for t in tasks:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _pipe(self, reader, writer):
        """Copies reader to writer, each chunk delivered `delay` after it was
        read, in order."""
        queue = asyncio.Queue()

        async def deliver():
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                queue.put_nowait((time.monotonic() + self.delay, data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((0, None))
        try:
            await task
        except (ConnectionError, OSError):
            pass

    async def _accept(self, reader, writer):
        if self.refuse:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        # No Nagle: small frames (PINGs) must not wait for ACKs, or the
        # relay adds tens of milliseconds of its own.
        for w in (writer, up_writer):
            s = w.get_extra_info("socket")
            if s is not None:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)
        except asyncio.CancelledError:
            pass  # the relay closed; asyncio's stream callback asks a cancelled task for its exception
        self._writers.difference_update((writer, up_writer))

    def set_delay(self, delay_ms):
        self.delay = delay_ms / 1000.0

    def cut(self):
        """Closes every open connection through the relay (a link failure)."""
        def do():
            for w in list(self._writers):
                w.close()
        self._loop.call_soon_threadsafe(do)

    def close(self):
        if self._loop.is_closed():
            return

        def stop():
            self._server.close()
            for w in list(self._writers):
                w.close()
            self._loop.stop()
        self._loop.call_soon_threadsafe(stop)
        self._thread.join(5)
