"""The official CloudEvents SDK for Python on the records of the Rust tests.

Reads one JSON request on stdin and writes one JSON answer on stdout:

- {"read": [{"headers": [[name, value]], "key": text|null, "value": text}]}
  reads each Kafka record with the SDK's Kafka binding (binary or structured
  mode, as the SDK detects it) and answers the event's attributes and data;
- {"write": [{"mode": "binary"|"structured", "attributes": {...}, "data": {...}}]}
  builds each event with the SDK and answers the Kafka records its binding
  makes (headers, key, value).
"""

import json
import sys

from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent


def read(record):
    headers = {name: value.encode() for name, value in record["headers"]}
    key = record["key"].encode() if record["key"] is not None else None
    message = kafka.KafkaMessage(headers=headers, key=key, value=record["value"].encode())
    event = kafka.from_kafka_event(message)
    data = event.get_data()
    if isinstance(data, (bytes, bytearray)):
        data = json.loads(data)
    partitionkey = event.get_extension("partitionkey")
    if isinstance(partitionkey, (bytes, bytearray)):
        partitionkey = partitionkey.decode()
    time = event.get_time()
    return {
        "specversion": event.get_specversion(),
        "id": event.get_id(),
        "source": event.get_source(),
        "type": event.get_type(),
        "subject": event.get_subject(),
        "time": time.isoformat() if time is not None else None,
        "datacontenttype": event.get_datacontenttype(),
        "dataschema": event.get_dataschema(),
        "partitionkey": partitionkey,
        "traceparent": event.get_extension("traceparent"),
        "data": data,
    }


def write(request):
    event = CloudEvent(attributes=request["attributes"], data=request["data"])
    if request["mode"] == "binary":
        message = kafka.to_binary_event(event)
    else:
        message = kafka.to_structured_event(event)
    key = message.key
    if isinstance(key, (bytes, bytearray)):
        key = key.decode()
    return {
        "headers": [[name, value.decode()] for name, value in message.headers.items()],
        "key": key,
        "value": message.value.decode(),
    }


def main():
    request = json.load(sys.stdin)
    if "read" in request:
        answer = [read(record) for record in request["read"]]
    else:
        answer = [write(event) for event in request["write"]]
    json.dump(answer, sys.stdout)


main()
