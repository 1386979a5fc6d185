"""The design seed's relay, run as the seed describes it, for the seed_python bench.

The loop of the seed (../shared/seeds, "outbox relay"): in one transaction,
select up to BATCH_SIZE unpublished rows in id order FOR UPDATE SKIP LOCKED;
for each row send it with aiokafka's send_and_wait (key = partition key,
value = the JSON payload, no headers) and UPDATE its published_at; commit;
then sleep POLL_INTERVAL_SECONDS. SQLAlchemy's async engine over asyncpg.

Differences from the seed, both forced by the environment and printed:
- enable_idempotence=False: the tansu broker refuses aiokafka's idempotent
  producer handshake (the seed asks for True);
- the loop ends once a batch finds no row (the bench drains a backlog).

Prints one JSON line: {"published": n, "seconds": s, "idempotence": false}.
"""

import argparse
import asyncio
import json
import time
from datetime import datetime, timezone

from aiokafka import AIOKafkaProducer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine


async def publish_batch(session_factory, producer, batch_size):
    async with session_factory() as session:
        async with session.begin():
            rows = (
                await session.execute(
                    text(
                        "SELECT id, event_id, topic, partition_key, payload"
                        " FROM outbox_event WHERE published_at IS NULL"
                        " ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED"
                    ),
                    {"limit": batch_size},
                )
            ).mappings().all()
            for row in rows:
                payload = row["payload"]
                value = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                await producer.send_and_wait(
                    row["topic"], key=row["partition_key"].encode(), value=value
                )
                await session.execute(
                    text("UPDATE outbox_event SET published_at = :now WHERE id = :id"),
                    {"now": datetime.now(timezone.utc), "id": row["id"]},
                )
            return len(rows)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True, help="postgresql+asyncpg://...")
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()

    engine = create_async_engine(args.dsn)
    session_factory = async_sessionmaker(engine, expire_on_commit=False)
    producer = AIOKafkaProducer(bootstrap_servers=args.brokers, enable_idempotence=False)
    await producer.start()
    published = 0
    started = time.monotonic()
    try:
        while True:
            n = await publish_batch(session_factory, producer, args.batch)
            published += n
            if n == 0:
                break
            await asyncio.sleep(args.poll)
    finally:
        await producer.stop()
        await engine.dispose()
    print(
        json.dumps(
            {
                "published": published,
                "seconds": time.monotonic() - started,
                "idempotence": False,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
