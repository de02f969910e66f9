"""Produce kjob jobs straight to Kafka from Python: confluent-kafka with its
Avro serializer and schema registry client (Confluent wire format).

kjob headers are optional: without kjob-id, kjob derives the job's id from
where the record entered the route (<topic>:<partition>:<offset>); without
kjob-attempt it is attempt 1; without kjob-job/kjob-version the route's
contract is assumed (the schema id in the frame is what decoding uses).
This transaction-less path suits jobs that are not tied to a database
change; for those that are, use kjob.enqueue (enqueue.py).

Run by tests/tests/polyglot.rs; prints {"produced": N}.
"""
import json
import os

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

topic = os.environ["KJOB_TEST_TOPIC"]
first = int(os.environ["KJOB_TEST_SEQ"])
count = int(os.environ["KJOB_TEST_COUNT"])

# The client has no request timeout by default: a registry that accepts the
# connection and never answers would block this producer forever.
registry = SchemaRegistryClient({"url": os.environ["KJOB_SCHEMA_REGISTRY_URL"],
                                 "timeout": 10})
serialize = AvroSerializer(registry, os.environ["KJOB_SCHEMA"])
producer = Producer({
    "bootstrap.servers": os.environ["KJOB_BOOTSTRAP_SERVERS"],
    "acks": "all",
    "enable.idempotence": True,
})
failed = []
for seq in range(first, first + count):
    key = f"py-{seq % 5}"
    value = serialize({"key": key, "seq": seq, "behaviour": "ok"},
                      SerializationContext(topic, MessageField.VALUE))
    # Half with kjob-id (the app's own id for the job), half with no header.
    headers = [("kjob-id", f"python-{seq}")] if seq < first + count // 2 else []
    producer.produce(topic, key=key, value=value, headers=headers,
                     on_delivery=lambda err, _msg: err and failed.append(str(err)))
left = producer.flush(30)
if left:
    raise SystemExit(f"{left} records not delivered within 30 s")
if failed:
    raise SystemExit(f"not delivered: {failed}")
print(json.dumps({"produced": count}))
