"""`python -m tasks deadletters list | show ID | replay ID | purge ID | purge --older-than D`.

The store's logic is `tasks.deadletters.store.DeadLetters`; this module parses, prints and turns the
store's refusals into one line on stderr and exit code 1 (nothing changed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from tasks.cli.common import emit, fail, open_resources, require_tables
from tasks.cli.words import when_iso, word
from tasks.config.envparse import parse_duration, spoken_duration
from tasks.config.settings import redact
from tasks.deadletters.view import (
    SEND_RETRY,
    letter_facts,
    shown_payload,
    summary_dict,
    with_hint,
)

if TYPE_CHECKING:
    from tasks.deadletters.store import DeadLetters

__all__ = ["deadletters"]


class _Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@contextmanager
def _store() -> Iterator[DeadLetters]:
    import tasks.celery  # noqa: F401  (the app registers every wing's dead-letter kinds)
    from tasks.deadletters.store import DeadLetterError, DeadLetters

    with open_resources() as res:
        require_tables(res)
        try:
            yield DeadLetters(res.sessions)
        except DeadLetterError as exc:
            fail(with_hint(exc))


@click.group()
def deadletters() -> None:
    """List, show, replay and purge dead letters (what failed for good, with its reason)."""


@deadletters.command("list")
@click.option("--kind", default=None, help="only letters of this kind (e.g. task)")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50,
              show_default=True, help="newest letters to list")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON envelope: kind dead_letter, the letters as items")
def list_letters(kind: str | None, limit: int, as_json: bool) -> None:
    """The newest dead letters, without their payloads."""
    from tasks.cli.render import console_for, letters_table

    with _store() as store:
        letters = store.recent(limit, kind)
    if as_json:
        emit("dead_letter", items=[summary_dict(s) for s in letters])
        return
    console = console_for()
    if not letters:
        console.print("no dead letters" + (f" of kind {kind!r}" if kind else ""))
        return
    console.print(letters_table(letters, console.width))


@deadletters.command()
@click.argument("letter_id", metavar="ID", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True,
              help="one JSON envelope: kind dead_letter, the letter as its item")
def show(letter_id: int, as_json: bool) -> None:
    """One letter with its payload (credentials hidden, at most SHOW_LIMIT characters)."""
    from tasks.cli.render import print_lines
    from tasks.deadletters.store import replay_refusal

    with _store() as store:
        letter = store.get(letter_id)
    shown, payload, cut = shown_payload(letter)
    refusal = replay_refusal(letter.payload, letter.kind)
    facts = letter_facts(letter)
    if as_json:
        # The payload as an object, or as its cut text when it is longer than SHOW_LIMIT.
        emit("dead_letter", item={**facts, "payload": payload if cut else shown,
                                  "payload_cut": cut})
        return
    lines = [f"{name}: {when_iso(value) if name.endswith('_at') else word(value)}"
             for name, value in facts.items()]
    if refusal is not None:
        lines.append(f"not replayable: {refusal}")
    print_lines(lines)
    click.echo("payload:")
    click.echo(payload)


@deadletters.command()
@click.argument("letter_id", metavar="ID", type=click.IntRange(min=1))
def replay(letter_id: int) -> None:
    """Send the letter's task again (same name and arguments, new task id); once per letter."""
    from tasks.celery import app
    from tasks.deadletters.store import DeadLetterError

    def send(name: str, args: list[Any], kwargs: dict[str, Any], task_id: str) -> None:
        app.send_task(name, args=args, kwargs=kwargs, task_id=task_id, serializer="json",
                      retry_policy=SEND_RETRY)

    with _store() as store:
        try:
            done = store.replay(letter_id, send)
        except DeadLetterError:
            raise
        except Exception as exc:  # the broker or result backend is away: the claim is undone
            reason = redact(" ".join(str(exc).split()))[:300]
            fail(f"dead letter {letter_id}: its task could not be sent ({type(exc).__name__}: "
                 f"{reason}); the letter is unchanged and can be replayed later")
    if done.note is not None:
        click.echo(f"replayed dead letter {done.letter_id}: {done.note}")
        return
    click.echo(f"replayed dead letter {done.letter_id}: {done.task} sent as task {done.task_id}")


@deadletters.command()
@click.argument("letter_id", metavar="[ID]", type=click.IntRange(min=1), required=False)
@click.option("--older-than", "older_than", type=_Duration(), default=None,
              help="delete every letter older than this (e.g. 7d, 12h, 30m)")
def purge(letter_id: int | None, older_than: float | None) -> None:
    """Delete one letter by ID, or every letter older than --older-than."""
    if (letter_id is None) == (older_than is None):
        raise click.UsageError("give either ID or --older-than DURATION (not both)")
    with _store() as store:
        if letter_id is not None:
            store.purge(letter_id)
            click.echo(f"purged dead letter {letter_id}")
            return
        gone = store.prune(older_than or 0.0)
        click.echo(f"purged {gone:,} dead letters older than {spoken_duration(older_than or 0.0)}")
