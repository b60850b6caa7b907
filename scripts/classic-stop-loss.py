#!/usr/bin/env python3
"""What a broker stop does to dead-lettering, with no router at all.

20,000 persistent 2-byte messages wait in one bucket queue (fixed TTL 12 s,
dead-lettering through a fanout exchange into a target queue); `rabbitmqctl
stop_app` runs `offset` seconds after the first of them expires, `start_app`
2 s later. Once the bucket is empty it counts the target: sent - counted is
what RabbitMQ dropped. Classic queues dead-letter at most once; quorum
queues with x-dead-letter-strategy at-least-once (what delay-router
declares with queue_type = "quorum") re-send until the target confirms.

It stops the broker's application: run it alone, never beside the tests.

    python3 -m pip install pika
    scripts/classic-stop-loss.py [--type classic|quorum] [--offset 0.0] [--runs 1]

Env: AMQP_HOST (127.0.0.1), AMQP_PORT (5672), RABBITMQCTL (rabbitmqctl;
e.g. scripts/rabbitmqctl4 for the 4.x node).
"""
import argparse
import os
import subprocess
import sys
import time
import uuid

try:
    import pika
except ImportError:
    sys.exit("needs pika: python3 -m pip install pika")

N = 20_000
TTL = 12.0
HOST = os.environ.get("AMQP_HOST", "127.0.0.1")
PORT = int(os.environ.get("AMQP_PORT", "5672"))
CTL = os.environ.get("RABBITMQCTL", "rabbitmqctl").split()


def channel():
    c = pika.BlockingConnection(pika.ConnectionParameters(HOST, PORT))
    return c, c.channel()


def ctl(*args):
    subprocess.run(CTL + ["-q", *args], check=True)


def run(queue_type, offset):
    p = "stoploss-" + uuid.uuid4().hex[:6]
    typed = {"x-queue-type": "quorum"} if queue_type == "quorum" else {}
    safe = (
        {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
        if queue_type == "quorum"
        else {}
    )
    c, h = channel()
    h.exchange_declare(p + ".dlx", "fanout", durable=True)
    h.queue_declare(p + ".target", durable=True, arguments=typed)
    h.queue_bind(p + ".target", p + ".dlx")
    args = {"x-message-ttl": int(TTL * 1000), "x-dead-letter-exchange": p + ".dlx"}
    h.queue_declare(p + ".bucket", durable=True, arguments={**args, **typed, **safe})
    t0 = time.time()
    for i in range(N):
        h.basic_publish("", p + ".bucket", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    while h.queue_declare(p + ".bucket", passive=True).method.message_count < N:
        time.sleep(0.1)
    c.close()
    time.sleep(max(0.0, t0 + TTL + offset - time.time()))
    ctl("stop_app")
    time.sleep(2)
    ctl("start_app")
    ctl("await_startup")
    c, h = channel()
    deadline = time.time() + TTL + 60
    while h.queue_declare(p + ".bucket", passive=True).method.message_count > 0:
        if time.time() > deadline:
            break
        time.sleep(0.5)
    time.sleep(2)
    left = h.queue_declare(p + ".bucket", passive=True).method.message_count
    got = h.queue_declare(p + ".target", passive=True).method.message_count
    for q in (".target", ".bucket"):
        h.queue_delete(p + q)
    h.exchange_delete(p + ".dlx")
    c.close()
    lost = max(0, N - got - left)
    extra = max(0, got + left - N)
    print(
        f"{queue_type:7} stop_app {offset:+.1f}s after the first expiry: "
        f"sent {N}, dead-lettered {got}, still waiting {left}, lost {lost}, duplicated {extra}",
        flush=True,
    )


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--type", choices=["classic", "quorum"], default="classic")
    a.add_argument("--offset", type=float, default=0.0)
    a.add_argument("--runs", type=int, default=1)
    o = a.parse_args()
    for _ in range(o.runs):
        run(o.type, o.offset)


if __name__ == "__main__":
    main()
