"""The Kafka sink: `sink.py` (settings, the producer's delivery, its columns), `clients.py`
(the producers and admin clients each process shares, librdkafka's log)."""

from walstream.sinks.kafka.sink import KafkaDestination, KafkaSink

__all__ = ["KafkaDestination", "KafkaSink"]
