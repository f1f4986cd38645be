"""A size limit on task messages: MAX_MESSAGE_BYTES.

- **On publish** (`LimitedAMQP`, the app's `amqp` class): every message this app sends, through
  `apply_async`, `send_task`, `celery -A tasks call` or beat, is measured as the JSON body the
  broker would get; a larger one raises `MessageTooLarge` before anything reaches the broker.
- **On receipt** (`strategy`, the `Strategy` of every task): a message from another producer
  that is larger is not decoded nor run. Its task fails with `MessageTooLarge` in the result
  backend, a dead letter (kind `oversized-message`) keeps its task name, id, size and a short
  prefix, and the message is acknowledged: it would be refused again on every redelivery.
- **Compressed on receipt** (`LimitedAMQP.TaskConsumer`, a zlib bomb's defence): kombu inflates the
  body of a message with a `compression` header while it builds the message, before the
  strategy runs, so 64 KB of zlib on the wire used to become 64 MB in the worker's main
  process. The task consumer's process inflates every received body with `inflate_bounded`,
  which stops after MAX_MESSAGE_BYTES + 1 bytes; a body that goes past (or that uses a
  compression with no bounded decompressor) is refused the same way, unread past the limit.

- **In results** (`bounded_backend`, the result backend the app builds): with
  `result_extended` a stored result repeats the call's arguments, and a failure stores its
  exception's arguments and traceback. A string argument longer than `RESULT_TEXT_LIMIT`
  characters is stored as its quoted prefix, and a traceback keeps its head and its tail, so a
  large argument that was allowed through (under MAX_MESSAGE_BYTES) or an exception that
  carries a large value never becomes a large result.

- **In logs** (`BoundedLines`, a filter on every handler of the worker and beat): a log record
  longer than `LOG_LINE_LIMIT` characters (a task that failed with its 200 KB argument in
  the exception, a received message's arguments) keeps its head and a note of what was cut;
  so does every line of its traceback.

Every message quotes at most a short prefix of the value (`tasks.store.validate.quote`), so a 1 MB
argument never becomes a 1 MB error, result, dead letter or log line.
"""

from __future__ import annotations

import bz2
import logging
import lzma
import traceback
import zlib
from collections.abc import Callable
from typing import Any

import kombu.message
from celery.app.amqp import AMQP
from celery.worker.strategy import default as default_strategy
from kombu.utils.json import dumps

from tasks.config.settings import settings_of
from tasks.deadletters.kinds import OVERSIZED_KIND
from tasks.deadletters.store import DeadLetters
from tasks.store.resources import resources_for
from tasks.store.validate import InvalidArguments, quote

__all__ = ["MessageTooLarge", "InflatesTooLarge", "UnboundedCompression", "LimitedAMQP",
           "strategy", "refuse_oversized", "OVERSIZED_KIND", "check_size", "inflate_bounded",
           "bounded_backend",
           "RESULT_TEXT_LIMIT", "BoundedLines", "LOG_LINE_LIMIT", "bound_log_handlers"]

log = logging.getLogger("tasks.worker.limits")

# A string in a stored result (an argument, an exception argument) longer than this is cut.
RESULT_TEXT_LIMIT = 1024
# A stored traceback keeps this many characters of its head and of its tail.
TRACEBACK_KEEP = 4096

# A log line (and each line of a logged traceback) is cut to this many characters.
LOG_LINE_LIMIT = 2000


# kombu's compressions (its names and aliases) that a worker inflates, each with a streaming
# decompressor that can stop at a given output size. Anything else is refused unread.
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "application/x-gzip": zlib.decompressobj,
    "application/x-bz2": bz2.BZ2Decompressor,
    "application/x-lzma": lzma.LZMADecompressor,
}
_COMPRESSION_ALIASES = {"gzip": "application/x-gzip", "zlib": "application/x-gzip",
                        "bzip2": "application/x-bz2", "bzip": "application/x-bz2",
                        "lzma": "application/x-lzma", "xz": "application/x-lzma"}


class MessageTooLarge(InvalidArguments):
    """A task message exceeds MAX_MESSAGE_BYTES; it was not sent (or not run)."""


class InflatesTooLarge(MessageTooLarge):
    """A compressed message inflates past MAX_MESSAGE_BYTES; it was not inflated further."""


class UnboundedCompression(MessageTooLarge):
    """A message uses a compression this worker cannot inflate within MAX_MESSAGE_BYTES; it
    was not inflated at all."""


def _limit(app: Any) -> int:
    limit: int = app.conf.get("max_message_bytes") or 0
    return limit


def check_size(name: str, size: int, limit: int, sample: Any) -> None:
    """Raise `MessageTooLarge` when `size` exceeds `limit` (0: no limit)."""
    if limit and size > limit:
        raise MessageTooLarge(
            f"task {quote(name)}: message of {size:,} bytes exceeds MAX_MESSAGE_BYTES "
            f"({limit:,}); arguments start {quote(sample)}")


class LimitedAMQP(AMQP):  # type: ignore[misc]
    """Celery's AMQP with the publish-side size check."""

    def _create_task_sender(self) -> Any:
        send = super()._create_task_sender()
        app = self.app

        def send_task_message(producer: Any, name: str, message: Any, *args: Any,
                              **kwargs: Any) -> Any:
            limit = _limit(app)
            if limit:
                body = message.body
                check_size(name, len(dumps(body)), limit, body[:2] if isinstance(
                    body, tuple) else body)
            return send(producer, name, message, *args, **kwargs)

        return send_task_message

    def TaskConsumer(self, channel: Any, queues: Any = None, accept: Any = None,
                     **kw: Any) -> Any:
        """Celery's task consumer, in a process whose received bodies inflate at most
        MAX_MESSAGE_BYTES, refusing a compressed message that would inflate past it."""
        _install_inflate_limit(self.app)
        kw["on_decode_error"] = _refusing_decode_errors(self.app, kw.get("on_decode_error"))
        return super().TaskConsumer(channel, queues, accept, **kw)


def inflate_bounded(body: Any, compression: str, limit: int) -> bytes:
    """`body` inflated with `compression` (a kombu name or alias), or `InflatesTooLarge` as soon
    as more than `limit` bytes come out: at most `limit` + 1 bytes are ever produced.

    Concatenated bz2 and lzma streams are inflated one after another (as `bz2.decompress`
    does); zlib ignores what follows its stream (as `zlib.decompress` does). A truncated
    stream raises the decompressor's own error (EOFError)."""
    kind = _COMPRESSION_ALIASES.get(compression, compression)
    factory = _DECOMPRESSORS.get(kind)
    data = body.encode() if isinstance(body, str) else bytes(body)
    if factory is None:
        raise UnboundedCompression(
            f"compression {quote(compression)} cannot be inflated within MAX_MESSAGE_BYTES "
            f"({limit:,}): message of {len(data):,} bytes refused unread")
    out = bytearray()
    while True:
        stream = factory()
        out += stream.decompress(data, limit + 1 - len(out))
        if len(out) > limit:
            raise InflatesTooLarge(
                f"compressed message ({kind}, {len(body):,} bytes) exceeds MAX_MESSAGE_BYTES "
                f"({limit:,}) once inflated; refused before inflating further")
        if not stream.eof:
            raise EOFError(f"compressed message ({kind}) ends before its end-of-stream marker")
        data = stream.unused_data
        if not data or kind == "application/x-gzip":
            return bytes(out)


def _install_inflate_limit(app: Any) -> None:
    """Every message this process receives is inflated by `inflate_bounded` (idempotent).

    kombu's `Message.__init__` calls the `decompress` of its own module, so only received
    messages are bounded: results (`celery.backends.base` imports its own) are not."""
    current = kombu.message.decompress
    if getattr(current, "__wrapped__", None) is not None:
        return

    def decompress(body: Any, content_type: str) -> Any:
        limit = _limit(app)
        return inflate_bounded(body, content_type, limit) if limit else current(
            body, content_type)

    decompress.__wrapped__ = current  # type: ignore[attr-defined]
    setattr(kombu.message, "decompress", decompress)  # noqa: B010


def _refusing_decode_errors(app: Any, fallback: Any) -> Callable[[Any, Exception], None]:
    """A task consumer's `on_decode_error`: a compressed message refused for its size is
    dead-lettered like an oversized one; any other decode error goes to `fallback` (Celery's
    own: logged, acknowledged)."""
    def on_decode_error(message: Any, exc: Exception) -> None:
        if not isinstance(exc, MessageTooLarge):
            if fallback is None:
                raise exc
            fallback(message, exc)
            return
        headers = message.headers or {}
        name = str(headers.get("task") or "unknown task")
        task = app.tasks.get(name)
        raw = message.body
        _refuse(name, task.backend if task is not None else app.backend, app, message,
                MessageTooLarge(f"task {quote(name)}: {exc}"),
                {"bytes": len(raw) if isinstance(raw, bytes | str) else 0,
                 "compression": str(headers.get("compression"))[:64]})

    return on_decode_error


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
    """Celery's default strategy, refusing oversized messages before they are decoded."""
    handler = default_strategy(task, app, consumer, **kwargs)
    limit = _limit(app)

    def task_message_handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any,
                             **more: Any) -> Any:
        if refuse_oversized(task, app, message, limit):
            return None
        return handler(message, body, ack, reject, callbacks, **more)

    return task_message_handler


def refuse_oversized(task: Any, app: Any, message: Any, limit: int | None = None) -> bool:
    """Refuse `message` of `task` (log, dead letter, failure, ack) if it is larger than
    MAX_MESSAGE_BYTES; whether it was refused. `limit`: the app's, when the caller has it."""
    limit = _limit(app) if limit is None else limit
    raw = message.body
    size = len(raw) if isinstance(raw, bytes | str) else 0
    if not limit or size <= limit:
        return False
    try:
        check_size(task.name, size, limit, raw[:64])
    except MessageTooLarge as exc:
        _refuse(task.name, task.backend, app, message, exc, {"bytes": size})
    return True


def _refuse(name: str, backend: Any, app: Any, message: Any, error: MessageTooLarge,
            facts: dict[str, Any]) -> None:
    """Log, dead-letter (OVERSIZED_KIND, with `facts` and a short prefix of the body), fail the
    task in the result backend, and acknowledge: it would be refused on every redelivery."""
    headers = message.headers or {}
    task_id = str(headers.get("id") or "")
    raw = message.body
    prefix = raw[:64] if isinstance(raw, bytes | str) else b""
    log.error("refused task %s[%s]: %s", name, task_id, error)
    try:
        # The app's settings (PlatformCelery carries them): limits is imported by the app, so it
        # never imports the app back.
        settings = settings_of(app)
        DeadLetters(resources_for(settings).sessions).add(
            OVERSIZED_KIND, task_id or name, str(error),
            {"task": name, **facts, "prefix": quote(prefix)})
        if task_id:
            backend.mark_as_failure(task_id, error)
    finally:
        message.ack()


def _bounded(value: Any, depth: int = 0) -> Any:
    """`value` with every long string replaced by its quoted prefix (containers kept)."""
    if isinstance(value, str | bytes):
        return quote(value) if len(value) > RESULT_TEXT_LIMIT else value
    if depth < 4 and isinstance(value, list | tuple):
        return type(value)(_bounded(item, depth + 1) for item in value)
    if depth < 4 and isinstance(value, dict):
        return {key: _bounded(item, depth + 1) for key, item in value.items()}
    return value


def _bounded_traceback(text: Any) -> Any:
    if not isinstance(text, str) or len(text) <= 2 * TRACEBACK_KEEP:
        return text
    cut = len(text) - 2 * TRACEBACK_KEEP
    return f"{text[:TRACEBACK_KEEP]}\n... ({cut:,} characters cut) ...\n{text[-TRACEBACK_KEEP:]}"


class _BoundedResults:
    """Mixed into the configured result backend's class: results store no long strings."""

    def prepare_exception(self, exc: BaseException, serializer: Any = None) -> Any:
        meta = super().prepare_exception(exc, serializer)  # type: ignore[misc]
        if isinstance(meta, dict) and "exc_message" in meta:
            meta["exc_message"] = _bounded(meta["exc_message"])
        return meta

    def _get_result_meta(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        meta: dict[str, Any] = super()._get_result_meta(*args, **kwargs)  # type: ignore[misc]
        for key in ("args", "kwargs"):
            if meta.get(key) is not None:
                meta[key] = _bounded(meta[key])
        meta["traceback"] = _bounded_traceback(meta.get("traceback"))
        return meta


def bounded_backend(backend_cls: type) -> type:
    """`backend_cls` with `_BoundedResults` in front of it (any Celery result backend)."""
    return type(f"Bounded{backend_cls.__name__}", (_BoundedResults, backend_cls), {})


def _cut_line(line: str) -> str:
    if len(line) <= LOG_LINE_LIMIT:
        return line
    return f"{line[:LOG_LINE_LIMIT]}... ({len(line) - LOG_LINE_LIMIT:,} characters cut)"


class BoundedLines(logging.Filter):
    """Cuts every line of a log record (message and traceback) to `LOG_LINE_LIMIT`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(len(line) > LOG_LINE_LIMIT for line in message.splitlines()):
            record.msg = "\n".join(_cut_line(line) for line in message.splitlines())
            record.args = None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_text = "\n".join(_cut_line(line) for line in text.rstrip().splitlines())
        elif record.exc_text:
            record.exc_text = "\n".join(_cut_line(line) for line in record.exc_text.splitlines())
        return True


def bound_log_handlers(logger: logging.Logger) -> None:
    """Put one `BoundedLines` on every handler of `logger` (Celery's setup signals call it)."""
    for handler in logger.handlers:
        if not any(isinstance(f, BoundedLines) for f in handler.filters):
            handler.addFilter(BoundedLines())
