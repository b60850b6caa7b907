#!/usr/bin/env python3
"""Zero-code retries with delay-router, from Python (pika).

The work queue dead-letters to the router exchange; the consumer only nacks
(requeue=False) when it fails. The router sends the message back to this queue
after the delay of the [[policy]] matching the queue name, and counts attempts
in the x-delay-router-attempts header.

    python3 examples/zero_code_retry.py

Env: AMQP_URL (amqp://guest:guest@127.0.0.1:5672/%2f), ROUTER_EXCHANGE
(delay.router), QUEUE (example.work), FAILURES (2: fail this many times, then
succeed), TIMEOUT (60 seconds).
"""
import os
import sys
import time

import pika

url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
router = os.environ.get("ROUTER_EXCHANGE", "delay.router")
queue = os.environ.get("QUEUE", "example.work")
failures = int(os.environ.get("FAILURES", "2"))
timeout = float(os.environ.get("TIMEOUT", "60"))

conn = pika.BlockingConnection(pika.URLParameters(url))
ch = conn.channel()
ch.confirm_delivery()
# The only thing a work queue needs: its dead-letter exchange is the router's.
ch.queue_declare(queue, durable=True, arguments={"x-dead-letter-exchange": router})
ch.basic_publish("", queue, b"charge card 42", pika.BasicProperties(delivery_mode=2, message_id="job-42"))

start = time.monotonic()
deliveries = 0


def on_message(channel, method, properties, body):
    global deliveries
    deliveries += 1
    attempts = (properties.headers or {}).get("x-delay-router-attempts", "-")
    print(f"delivery {deliveries} attempts={attempts} at {time.monotonic() - start:.1f}s body={body.decode()}", flush=True)
    if deliveries <= failures:
        # The payment API answered 503: just nack, the router does the rest.
        channel.basic_nack(method.delivery_tag, requeue=False)
    else:
        channel.basic_ack(method.delivery_tag)
        print(f"succeeded after {deliveries} deliveries", flush=True)
        channel.stop_consuming()


ch.basic_consume(queue, on_message)
conn.call_later(timeout, lambda: (print("timed out", flush=True), ch.stop_consuming()))
ch.start_consuming()
conn.close()
sys.exit(0 if deliveries > failures else 1)
