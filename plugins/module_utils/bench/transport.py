# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark client's transport to OpenAI-compatible streaming completion servers (vLLM first),
standard library only (inference_client.py is the client's one import for scripts).

* pure stream decoding: ChunkedDecoder (HTTP/1.1 chunked transfer coding) and SSEParser (``data:``
  events), fed with whatever bytes arrive;
* the OpenAI completions stream: completion_payload() is the /v1/completions body, process_event()
  folds each streamed event into a RequestRecord (chunk times, per-chunk cumulative usage, the final
  usage; bench/metrics.py turns it into TTFT, TPOT and ITL);
* I/O: HttpConnection and ConnectionPool speak raw HTTP/1.1 with keep-alive over asyncio streams
  (TLS through ssl for https URLs); http_json() sends one small JSON request, stream_completion()
  and timed_request() one streamed completion, errors recorded in the RequestRecord, not raised.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# The client names itself in the User-Agent and in the results document (bench/sweep.py).
CLIENT_NAME = "gpufleet.inference_client"
CLIENT_VERSION = "1"
USER_AGENT = f"{CLIENT_NAME}/{CLIENT_VERSION}"

READ_SIZE = 65536
HEADER_LIMIT = 65536
ERROR_BODY_LIMIT = 65536


class ProtocolError(Exception):
    """The server broke HTTP/1.1 or the SSE format."""


# ---- endpoint -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_endpoint(url: str) -> Endpoint:
    """The server's base URL (``http://host:port``); a trailing ``/v1`` is dropped. ValueError if unusable."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("url is empty: give the server's base URL, for example http://127.0.0.1:8000")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url {url!r} must start with http:// or https:// (the server's base URL, e.g. http://127.0.0.1:8000)")
    if not parts.hostname:
        raise ValueError(f"url {url!r} has no host name")
    if parts.query or parts.fragment:
        raise ValueError(f"url {url!r} must not carry a query or fragment")
    if parts.username or parts.password:
        raise ValueError(f"url {url!r} must not carry credentials: use api_key")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"url {url!r} has an invalid port") from None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return Endpoint(parts.scheme, parts.hostname, port, path)


# ---- pure stream decoding -------------------------------------------------------------------------
class ChunkedDecoder:
    """Incremental decoder of the HTTP/1.1 chunked transfer coding; feed() returns the payload bytes."""

    _SIZE, _DATA, _CRLF, _TRAILER = range(4)

    def __init__(self) -> None:
        self._buf = b""
        self._state = self._SIZE
        self._remaining = 0
        self.done = False

    @property
    def leftover(self) -> bytes:
        """Bytes received after the last chunk (a well-behaved server sends none)."""
        return self._buf if self.done else b""

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        pos = 0
        out = []
        end = len(buf)
        while not self.done:
            if self._state == self._DATA:
                take = min(self._remaining, end - pos)
                if take <= 0:
                    break
                out.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining:
                    break
                self._state = self._CRLF
            if self._state == self._CRLF:
                if end - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunked body: chunk data is not followed by CRLF")
                pos += 2
                self._state = self._SIZE
            if self._state == self._SIZE:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if end - pos > 1024:
                        raise ProtocolError("chunked body: chunk-size line longer than 1024 bytes")
                    break
                line = buf[pos:nl].split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise ProtocolError(f"chunked body: invalid chunk size {line[:40]!r}") from None
                if size < 0:
                    raise ProtocolError("chunked body: negative chunk size")
                pos = nl + 2
                if size == 0:
                    self._state = self._TRAILER
                else:
                    self._remaining = size
                    self._state = self._DATA
                    continue
            if self._state == self._TRAILER:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                if nl == pos:
                    self.done = True
                pos = nl + 2
        self._buf = buf[pos:]
        return b"".join(out)


class SSEParser:
    """Incremental server-sent events parser; feed() returns the ``data`` of each complete event.

    Lines end in LF, CRLF or CR; ``:`` comment lines (keep-alive pings) and the ``event``, ``id`` and
    ``retry`` fields are ignored; several ``data`` lines of one event are joined with a newline.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line = ""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        text = self._line + self._decoder.decode(data)
        hold = ""
        if text.endswith("\r"):
            text, hold = text[:-1], "\r"
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        self._line = lines.pop() + hold
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if line[0] == ":":
                continue
            name, _sep, value = line.partition(":")
            if name == "data":
                self._data.append(value[1:] if value[:1] == " " else value)
        return events

    def close(self) -> list[str]:
        """At end of stream: an event the server did not end with a blank line still counts."""
        events = self.feed(b"\n\n") if (self._line or self._data) else []
        return events


# ---- the OpenAI completions request and its stream ----------------------------------------------
def completion_payload(model: str, prompt: list[int] | str, max_tokens: int, ignore_eos: bool = True,
                       per_chunk_usage: bool = True) -> dict[str, Any]:
    """The /v1/completions body: streamed, fixed length, greedy, usage in the stream."""
    payload: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if per_chunk_usage:
        payload["stream_options"]["continuous_usage_stats"] = True
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


# ---- records and the per-event fold ---------------------------------------------------------------
@dataclass
class RequestRecord:
    """What one streamed request produced, as seen by the client (perf_counter seconds)."""

    start: float = 0.0
    end: float = 0.0
    status: int | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_usage: list[int | None] = field(default_factory=list)  # cumulative completion tokens, when sent
    text_chars: int = 0
    usage_completion: int | None = None
    usage_prompt: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None


def process_event(rec: RequestRecord, data: str, now: float) -> bool:
    """Fold one SSE ``data`` payload into the record; True at ``[DONE]``. ProtocolError on bad JSON."""
    if data == "[DONE]":
        rec.done = True
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        raise ProtocolError(f"event is not JSON: {data[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"event is not a JSON object: {data[:120]!r}")
    if obj.get("error") is not None and not obj.get("choices"):
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        rec.error = f"server error in stream: {str(msg)[:200]}"
        return False
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    choices = obj.get("choices")
    if choices:
        choice = choices[0] if isinstance(choices[0], dict) else {}
        text = choice.get("text")
        if text is None and isinstance(choice.get("delta"), dict):
            text = choice["delta"].get("content")
        rec.chunk_times.append(now)
        rec.chunk_usage.append(_int_or_none(usage.get("completion_tokens")) if usage else None)
        rec.text_chars += len(text or "")
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]
    if usage:
        completion = _int_or_none(usage.get("completion_tokens"))
        if completion is not None:
            rec.usage_completion = completion
        prompt = _int_or_none(usage.get("prompt_tokens"))
        if prompt is not None:
            rec.usage_prompt = prompt
    return False


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---- HTTP/1.1 over asyncio streams ----------------------------------------------------------------
def connect_error_text(err: BaseException) -> str:
    """A short reason for a failed connection or request."""
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve the host name ({err.strerror or err})"
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    if isinstance(err, ssl.SSLError):
        return f"TLS error: {err.reason or err}"
    if isinstance(err, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(err, asyncio.IncompleteReadError):
        return "the server closed the connection mid-response"
    if isinstance(err, ProtocolError):
        return f"protocol error: {err}"
    if isinstance(err, OSError):
        return err.strerror or str(err) or type(err).__name__
    return f"{type(err).__name__}: {err}"


class HttpConnection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, endpoint: Endpoint, ssl_context: ssl.SSLContext | None) -> None:
        self.endpoint = endpoint
        self.ssl_context = ssl_context
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reusable = False
        self.used = 0

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            self.endpoint.host, self.endpoint.port, ssl=self.ssl_context, limit=HEADER_LIMIT,
            server_hostname=self.endpoint.host if self.ssl_context else None)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def close(self) -> None:
        self.reusable = False
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def send(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> None:
        if self.writer is None:
            raise ProtocolError("the connection is not open")
        lines = [f"{method} {self.endpoint.base_path}{path} HTTP/1.1", f"Host: {self.endpoint.host_header}",
                 f"User-Agent: {USER_AGENT}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.writer.write(head + body if body else head)
        await self.writer.drain()
        self.used += 1

    async def read_head(self) -> tuple[int, str, dict[str, str]]:
        if self.reader is None:
            raise ProtocolError("the connection is not open")
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ProtocolError("response headers longer than 64 KiB") from None
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise ProtocolError(f"bad status code in {lines[0][:80]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
        keep = headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
        self.reusable = keep
        return status, parts[2] if len(parts) > 2 else "", headers

    async def body_parts(self, headers: dict[str, str]):
        """Yield (payload bytes, perf_counter time they arrived) until the body ends."""
        reader = self.reader
        if reader is None:
            raise ProtocolError("the connection is not open")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoder = ChunkedDecoder()
            while not decoder.done:
                data = await reader.read(READ_SIZE)
                now = time.perf_counter()
                if not data:
                    self.reusable = False
                    raise asyncio.IncompleteReadError(b"", None)
                payload = decoder.feed(data)
                if payload:
                    yield payload, now
            if decoder.leftover:
                self.reusable = False
            return
        length = headers.get("content-length")
        if length is not None:
            try:
                remaining = int(length)
            except ValueError:
                raise ProtocolError(f"bad Content-Length {length!r}") from None
            while remaining > 0:
                data = await reader.read(min(READ_SIZE, remaining))
                now = time.perf_counter()
                if not data:
                    self.reusable = False
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(data)
                yield data, now
            return
        self.reusable = False  # body ends when the server closes
        while True:
            data = await reader.read(READ_SIZE)
            now = time.perf_counter()
            if not data:
                return
            yield data, now

    async def read_body(self, headers: dict[str, str], limit: int = ERROR_BODY_LIMIT) -> bytes:
        out = []
        size = 0
        parts = self.body_parts(headers)
        try:
            async for data, _now in parts:
                if size < limit:
                    out.append(data)
                size += len(data)
        finally:
            await parts.aclose()
        return b"".join(out)[:limit]


class ConnectionPool:
    """Idle keep-alive connections to one endpoint; a request takes one and gives it back if reusable."""

    def __init__(self, endpoint: Endpoint, ssl_context: ssl.SSLContext | None = None) -> None:
        self.endpoint = endpoint
        self.ssl_context = ssl_context
        self.idle: list[HttpConnection] = []
        self.opened = 0

    async def acquire(self) -> HttpConnection:
        if self.idle:
            return self.idle.pop()
        conn = HttpConnection(self.endpoint, self.ssl_context)
        await conn.open()
        self.opened += 1
        return conn

    def release(self, conn: HttpConnection) -> None:
        if conn.reusable and conn.writer is not None and not conn.writer.is_closing():
            self.idle.append(conn)
        else:
            conn.close()

    async def prefill(self, count: int) -> None:
        """Open connections up to ``count`` idle ones, so a measured window does not pay for connects."""
        missing = count - len(self.idle)
        if missing > 0:
            conns = await asyncio.gather(*[self._new() for _i in range(missing)])
            self.idle.extend(conns)

    async def _new(self) -> HttpConnection:
        conn = HttpConnection(self.endpoint, self.ssl_context)
        await conn.open()
        conn.reusable = True
        self.opened += 1
        return conn

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


def _error_message(status: int, reason: str, body: bytes) -> str:
    """``HTTP 400: <message>`` from an OpenAI/vLLM error body, or its first bytes."""
    text = body.decode("utf-8", "replace").strip()
    message = text
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            if isinstance(err, dict):
                message = str(err.get("message") or err.get("detail") or err)
            elif isinstance(obj.get("message"), str):
                message = obj["message"]
            elif isinstance(obj.get("detail"), str):
                message = obj["detail"]
            else:
                message = str(err)
    except ValueError:
        pass
    message = " ".join(message.split())[:300]
    return f"HTTP {status} {reason}".strip() + (f": {message}" if message else "")


async def http_raw(pool: ConnectionPool, method: str, path: str, headers: dict[str, str],
                   data: bytes | None = None) -> tuple[int, str, bytes]:
    """One small request on the pool (a reused connection that the server closed is retried once on a new one);
    returns (status, reason, body)."""
    for attempt in (0, 1):
        conn = await pool.acquire()
        reused = conn.used > 0
        try:
            await conn.send(method, path, headers, data)
            status, reason, rh = await conn.read_head()
            raw = await conn.read_body(rh, limit=16 * 1024 * 1024)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
            conn.close()
            if reused and attempt == 0:
                continue
            raise
        except BaseException:
            conn.close()
            raise
        pool.release(conn)
        return status, reason, raw
    raise ProtocolError("unreachable")  # pragma: no cover


async def http_json(pool: ConnectionPool, method: str, path: str, headers: dict[str, str],
                    body: dict | None = None) -> tuple[int, Any, str]:
    """One small request; returns (status, parsed JSON or None, error text for non-2xx)."""
    data = json.dumps(body).encode("utf-8") if body is not None else None
    hdrs = dict(headers)
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    hdrs["Accept"] = "application/json"
    status, reason, raw = await http_raw(pool, method, path, hdrs, data)
    if not 200 <= status < 300:
        return status, None, _error_message(status, reason, raw)
    try:
        return status, json.loads(raw.decode("utf-8")), ""
    except ValueError:
        return status, None, f"HTTP {status}: the answer is not JSON: {raw[:120]!r}"


async def _one_request(method: str, url: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, str, str | None]:
    parts = urlsplit(url)
    endpoint = parse_endpoint(f"{parts.scheme}://{parts.netloc}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = HttpConnection(endpoint, ssl.create_default_context() if endpoint.scheme == "https" else None)
    try:
        await conn.open()
        await conn.send(method, path, headers, body)
        status, reason, rh = await conn.read_head()
        raw = await conn.read_body(rh, limit=16 * 1024 * 1024)
    finally:
        conn.close()
    text = raw.decode("utf-8", "replace")
    return status, text, None if 200 <= status < 300 else f"HTTP {status} {reason}".strip()


def request_text(method: str, url: str, body: str | bytes | None, headers: dict[str, str],
                 timeout: float) -> tuple[int, str, str | None]:
    """One request on a connection of its own, for the readiness probes: (status, body text, error). A request that
    does not get an answer (refused, timed out, TLS, a broken response) is status -1 with the reason; an HTTP error
    status comes with its body. https verifies the server's certificate against the system's CAs."""
    data = body.encode("utf-8") if isinstance(body, str) else body
    try:
        return asyncio.run(asyncio.wait_for(_one_request(method, url, data, dict(headers)), timeout))
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ProtocolError, ValueError) as err:
        return -1, "", connect_error_text(err)


async def stream_completion(pool: ConnectionPool, body: bytes, headers: dict[str, str]) -> RequestRecord:
    """Send one streamed completion and fold its events into a RequestRecord (errors recorded, not raised)."""
    rec = RequestRecord()
    hdrs = dict(headers)
    hdrs["Content-Type"] = "application/json"
    hdrs["Accept"] = "text/event-stream"
    for attempt in (0, 1):
        rec = RequestRecord()
        conn = None
        reused = False
        received = False
        try:
            conn = await pool.acquire()
            reused = conn.used > 0
            rec.start = time.perf_counter()
            await conn.send("POST", "/v1/completions", hdrs, body)
            status, reason, rh = await conn.read_head()
            received = True
            rec.status = status
            if status != 200:
                raw = await conn.read_body(rh)
                rec.error = _error_message(status, reason, raw)
            else:
                parser = SSEParser()
                parts = conn.body_parts(rh)
                try:
                    async for payload, now in parts:
                        for event in parser.feed(payload):
                            if not rec.done:
                                process_event(rec, event, now)
                        if rec.error:
                            conn.reusable = False
                            break
                finally:
                    await parts.aclose()
                if not rec.done and not rec.error:
                    for event in parser.close():
                        if not rec.done:
                            process_event(rec, event, time.perf_counter())
            rec.end = time.perf_counter()
            pool.release(conn)
            return rec
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()
            raise
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as err:
            if conn is not None:
                conn.close()
            if conn is not None and reused and not received and attempt == 0:
                continue  # the server closed an idle keep-alive connection: retry once on a new one
            rec.error = connect_error_text(err)
        except (OSError, ProtocolError, ssl.SSLError) as err:
            if conn is not None:
                conn.close()
            rec.error = connect_error_text(err)
        rec.end = time.perf_counter()
        return rec
    return rec  # pragma: no cover


async def timed_request(pool: ConnectionPool, body: bytes, headers: dict[str, str], timeout: float) -> RequestRecord:
    start = time.perf_counter()
    try:
        return await asyncio.wait_for(stream_completion(pool, body, headers), timeout)
    except asyncio.TimeoutError:
        return RequestRecord(start=start, end=time.perf_counter(), error=f"timed out after {timeout:g} s")
