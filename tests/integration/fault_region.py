"""A fault-injecting stand-in for a region's gateway: an HTTP/2 server
(python3-h2, cleartext or TLS) that answers what a real region produces only by
accident, chosen by the request's prompt:

  "split"  200 text/event-stream, one whole event and half of the next,
           then RST_STREAM (a region whose worker died while its DATA
           frames were cut by flow control, not by events)
  "502"    a 502, as a region whose worker failed before answering
  "421"    a 421, as a region whose tags no longer have the residency the
           request needs (its origin read an older record)
  "504"    a 504, as a region whose worker stood still
  "429"    a 429 with Retry-After: 7, as a region whose workers' queues
           are full
  "hang"   GOAWAY that says this stream was taken, then nothing more on the
           connection, not even PING answers, for 20 s (a region that began
           draining and then wedged)
  "refuse" RST_STREAM(REFUSED_STREAM), as a region holding too many request
           bodies on the connection
  "goaway" GOAWAY whose last stream is below this one's, as a region that
           began draining before it read the request
  "tail"   200 text/event-stream whose last event lacks its blank line
  "error"  200 text/event-stream: one event, then an error event, then a
           clean end (a region whose worker's model failed mid-stream)
  a list of token ids, with a script set (replay_script = (run, data)):
           200 text/event-stream with x-infergate-replay: run, the data
           (a real worker's first events, token tags included), then
           RST_STREAM: a region that dies mid-stream, which its origin
           resumes elsewhere by token replay
  other    a 200 completion

Its answers cut short ("split", "error", a replay script's) say the power
a real region's would (x-infergate-power: POWER, 50 W at 200 gCO2e/kWh),
by which its origin counts their energy, no trailer coming.

With fail_status set (e.g. 500), it answers every completion with that
status, as a region whose workers all fail while it takes connections and
answers PINGs. Gateways' active health checks (x-infergate-health-check)
are counted in checks, not kept in requests.

It answers PINGs (h2 does), counts the requests it got and keeps the
x-infergate-residency each carried (residency). On a Unix socket (unix=PATH)
it plays a worker that took another's socket: /internal/stats gets a ready
worker's answer, and every path asked is kept (paths). Test use only."""
import json
import socket
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.errors
import h2.exceptions

POWER = "50 200"
EVENT = b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'


class FaultRegion:
    def __init__(self, tls=None, unix=None):
        """tls: (certificate, key) to serve h2 over TLS, as a region does;
        unix: a socket path to listen on instead of 127.0.0.1."""
        self.tls = None
        if tls:
            import ssl
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(*tls)
            self.tls.set_alpn_protocols(["h2"])
        if unix:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(unix)
            self.port = None
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("127.0.0.1", 0))
            self.port = self.sock.getsockname()[1]
        self.sock.listen(16)
        self.connections = 0
        self.paths = []
        self.requests = []
        self.residency = []
        self.replay_script = None
        self.fail_status = None
        self.checks = 0
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _answer(self, conn, sid, body, residency, path, check=False):
        with self.lock:
            self.paths.append(path)
        if path == "/internal/stats":
            msg = json.dumps({"queued": 0, "running": 0, "max_seqs": 4, "kv_blocks_free": 8,
                              "kv_blocks_total": 8}).encode()
            conn.send_headers(sid, [(":status", "200"), ("content-type", "application/json"),
                                    ("content-length", str(len(msg)))])
            conn.send_data(sid, msg, end_stream=True)
            return
        try:
            prompt = json.loads(body).get("prompt", "")
        except ValueError:
            prompt = ""
        with self.lock:
            if check:
                self.checks += 1
            else:
                self.requests.append(prompt)
                self.residency.append(residency)
        if self.fail_status:
            prompt = str(self.fail_status)
        if prompt in ("502", "504", "421", "429") or self.fail_status:
            msg = json.dumps({"error": {"message": "fault " + prompt, "type": "server_error", "param": None,
                                        "code": "fault"}}).encode()
            conn.send_headers(sid, [(":status", prompt), ("content-type", "application/json"),
                                    ("content-length", str(len(msg)))]
                              + ([("retry-after", "7")] if prompt == "429" else []))
            conn.send_data(sid, msg, end_stream=True)
        elif prompt == "tail":
            conn.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream")])
            conn.send_data(sid, EVENT + b"data: [DONE]\n", end_stream=True)
        elif prompt == "error":
            conn.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream"),
                                    ("x-infergate-power", POWER)])
            conn.send_data(sid, EVENT + b'data: {"error":{"message":"the model failed","type":"server_error",'
                           b'"param":null,"code":null}}\n\n', end_stream=True)
        elif prompt == "hang":
            conn.close_connection(last_stream_id=sid)
            return "hang"
        elif prompt == "goaway":
            conn.close_connection(last_stream_id=max(sid - 2, 0))
        elif prompt == "refuse":
            conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
        elif isinstance(prompt, list) and self.replay_script:
            run, data = self.replay_script
            conn.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream"),
                                    ("x-infergate-replay", run), ("x-infergate-power", POWER)])
            conn.send_data(sid, data)
            conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        elif prompt == "split":
            conn.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream"),
                                    ("x-infergate-power", POWER)])
            conn.send_data(sid, EVENT + EVENT[:40])
            conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        else:
            msg = json.dumps({"id": "x", "object": "text_completion", "choices": [
                {"index": 0, "text": "ok", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            conn.send_headers(sid, [(":status", "200"), ("content-type", "application/json"),
                                    ("content-length", str(len(msg)))])
            conn.send_data(sid, msg, end_stream=True)

    def _serve(self, c):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        bodies, residency, paths, checks = {}, {}, {}, {}
        try:
            if self.tls:
                c.settimeout(10)
                c = self.tls.wrap_socket(c, server_side=True)
                c.settimeout(None)
            c.sendall(conn.data_to_send())
            while not self.stopped:
                data = c.recv(65536)
                if not data:
                    return
                hang = False
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        bodies[ev.stream_id] = b""
                        residency[ev.stream_id] = dict(ev.headers).get("x-infergate-residency")
                        paths[ev.stream_id] = dict(ev.headers).get(":path")
                        checks[ev.stream_id] = "x-infergate-health-check" in dict(ev.headers)
                    elif isinstance(ev, h2.events.DataReceived):
                        bodies[ev.stream_id] = bodies.get(ev.stream_id, b"") + ev.data
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded):
                        hang |= self._answer(conn, ev.stream_id, bodies.pop(ev.stream_id, b""),
                                             residency.pop(ev.stream_id, None),
                                             paths.pop(ev.stream_id, None),
                                             checks.pop(ev.stream_id, False)) == "hang"
                c.sendall(conn.data_to_send())
                for _ in range(200 if hang else 0):  # wedged: read nothing, answer nothing
                    if self.stopped:
                        break
                    time.sleep(0.1)
                if hang:
                    return
        except (OSError, h2.exceptions.ProtocolError):  # ssl.SSLError is an OSError
            return
        finally:
            c.close()

    def stop(self):
        self.stopped = True
        self.sock.close()
