# The kombu side of `cargo bench --bench kombu`: kombu's own code declares
# its native delayed delivery topology (the NServiceBus design: 28 levels of
# TTL queues and exchanges, the delay in whole seconds as binary digits in the
# routing key) and computes the routing keys; the bench publishes and consumes
# in Rust, the same way for both designs.
#
#   driver.py declare URL PREFIX QUEUE_TYPE < countdowns.json > plan.json
#   driver.py delete URL PREFIX
import json
import sys

import kombu
from kombu import Connection, Exchange, Queue
from kombu.transport import native_delayed_delivery as ndd


def destination(prefix):
    exchange = Exchange(prefix + "_dest", type="topic", durable=True)
    return Queue(prefix + "_dest", exchange=exchange, routing_key="dest", durable=True)


def declare(conn, prefix, queue_type):
    ndd.declare_native_delayed_delivery_exchanges_and_queues(conn, queue_type, prefix)
    queue = destination(prefix)
    queue.bind(conn.channel()).declare()
    ndd.bind_queue_to_native_delayed_delivery_exchange(conn, queue, prefix)
    countdowns = json.load(sys.stdin)
    json.dump(
        {
            "kombu": kombu.__version__,
            "exchange": ndd.level_name(ndd.MAX_LEVEL, prefix),
            "queue": queue.name,
            "routing_keys": [ndd.calculate_routing_key(c, "dest") for c in countdowns],
        },
        sys.stdout,
    )


def delete(conn, prefix):
    channel = conn.channel()
    for level in range(ndd.MAX_NUMBER_OF_BITS_TO_USE):
        name = ndd.level_name(level, prefix)
        channel.queue_delete(name)
        channel.exchange_delete(name)
    channel.exchange_delete(ndd._celery_delayed_delivery_exchange(prefix))
    channel.queue_delete(prefix + "_dest")
    channel.exchange_delete(prefix + "_dest")


def main():
    command, url, prefix = sys.argv[1:4]
    with Connection(url) as conn:
        if command == "declare":
            declare(conn, prefix, sys.argv[4])
        elif command == "delete":
            delete(conn, prefix)
        else:
            sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
