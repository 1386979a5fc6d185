//! Reading a whole topic back, every partition up to its high watermark.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use uuid::Uuid;

/// One record as read back.
#[derive(Debug, Clone)]
pub struct Record {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers (name, value bytes; a name need not be UTF-8).
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Record {
    /// The UTF-8 value of the first header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v.as_deref()?).ok())
    }

    /// The value parsed as JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(self.value.as_deref()?).ok()
    }

    /// `event_id` of the payload, if it is one.
    pub fn event_id(&self) -> Option<Uuid> {
        self.json()?.get("event_id")?.as_str()?.parse().ok()
    }
}

/// Reads `topic` from the beginning to the high watermark of every partition,
/// in offset order per partition.
pub async fn read_all(brokers: &str, topic: &str) -> Vec<Record> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_blocking(&brokers, &topic))
        .await
        .expect("topic reader")
}

fn read_blocking(brokers: &str, topic: &str) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("faults-checker-{}", Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("checker consumer");
    let timeout = Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .expect("topic metadata");
    let mut assignment = TopicPartitionList::new();
    let mut remaining = Vec::new();
    for partition in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition.id(), timeout)
            .expect("watermarks");
        if high > low {
            remaining.push((partition.id(), high));
        }
        assignment
            .add_partition_offset(topic, partition.id(), Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut records = Vec::new();
    // After the watermarks are reached, keep reading until the topic is quiet
    // for a while: a broker may report a watermark below what it serves.
    let mut quiet_since: Option<Instant> = None;
    loop {
        assert!(Instant::now() < deadline, "reading {topic} timed out");
        if remaining.is_empty() {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_millis(1500) {
                break;
            }
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        quiet_since = None;
        let message = message.expect("read record");
        let headers = message
            .headers()
            .map(txoutbox_runtime::consumer::headers_as_bytes)
            .unwrap_or_default();
        records.push(Record {
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
        });
        remaining.retain(|&(p, high)| !(p == message.partition() && message.offset() + 1 >= high));
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    records
}
