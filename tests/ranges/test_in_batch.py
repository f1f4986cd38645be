"""`Context.in_batch`: the ids a batch writes by, as one array parameter on PostgreSQL and an
IN list elsewhere, matching exactly those ids on every database."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.orm import Session

from examples.tables import CM_DATA, migrate
from tasks.ranges.jobs import Context, get_job
from tasks.ranges.planning import Partition


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_in_batch_matches_exactly_the_ids_given(engine: Engine) -> None:
    import bench.cm_data  # noqa: F401  (registers the cm_data job)

    migrate(engine)
    with engine.begin() as conn:
        conn.execute(insert(CM_DATA), [{"id": i, "payload": f"p{i}", "status": 0}
                                       for i in range(1, 3001)])
    chosen = list(range(5, 3001, 7))
    with Session(engine) as session, session.begin():
        ctx = Context(session=session, fence=3, job=get_job("cm_data"),
                      partition=Partition(0, 1, 3000))
        # Any iterable of ids, in any order (on PostgreSQL also bounded by their range).
        clause = ctx.in_batch(CM_DATA.c.id, iter(sorted(chosen, key=lambda i: -i % 11)))
        session.execute(update(CM_DATA).where(clause).values(status=1))
        empty = session.execute(select(CM_DATA.c.id).where(
            ctx.in_batch(CM_DATA.c.id, []))).all()
    assert empty == []
    with engine.connect() as conn:
        done = list(conn.execute(select(CM_DATA.c.id).where(CM_DATA.c.status == 1)
                                 .order_by(CM_DATA.c.id)).scalars())
    assert done == chosen
    rendered = str(clause.compile(dialect=engine.dialect))
    assert ("ANY" in rendered) == (engine.dialect.name == "postgresql"), rendered
    assert ("BETWEEN" in rendered) == (engine.dialect.name == "postgresql"), rendered
