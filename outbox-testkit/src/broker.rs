//! The Kafka-protocol broker of the tests: its address, topics and names, and
//! private tansu broker processes for tests that stop or restart one.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use uuid::Uuid;

/// `bootstrap.servers` of the shared test broker: `KAFKA_BROKERS_TEST`
/// (`.cargo/config.toml` sets it), else `127.0.0.1:9092`.
pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS_TEST").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A client configuration with `bootstrap.servers` set to `brokers` and
/// nothing else.
pub fn client_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config
}

/// `<prefix>-<random>`: a topic name no earlier run used (the shared broker
/// keeps its topics between runs).
pub fn unique_topic(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

/// `<prefix>-<random>`: a consumer group id no earlier run used.
pub fn unique_group(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

/// Creates each `(topic, partitions)` on `brokers` with replication factor 1
/// and returns the names of those that already existed.
///
/// # Panics
/// If the admin request fails or a topic fails for another reason than
/// existing already.
pub async fn create_topics(brokers: &str, topics: &[(&str, i32)]) -> Vec<String> {
    let admin: AdminClient<DefaultClientContext> =
        client_config(brokers).create().expect("admin client");
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|&(name, partitions)| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(&new, &options)
        .await
        .expect("create topics");
    let mut existing = Vec::new();
    for result in results {
        if let Err((name, code)) = result {
            assert_eq!(
                code,
                RDKafkaErrorCode::TopicAlreadyExists,
                "creating {name}"
            );
            existing.push(name);
        }
    }
    existing
}

/// Creates `topic` with `partitions` partitions unless it exists.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    create_topics(brokers, &[(topic, partitions)]).await;
}

/// Creates a topic named [`unique_topic`]`(prefix)` and returns its name.
///
/// # Panics
/// If the topic existed already.
pub async fn new_topic(brokers: &str, prefix: &str, partitions: i32) -> String {
    let topic = unique_topic(prefix);
    let existing = create_topics(brokers, &[(&topic, partitions)]).await;
    assert!(existing.is_empty(), "{topic} existed already");
    topic
}

/// A local TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("bound")
        .port()
}

/// The tansu binary: `TANSU_BIN`, else where `scripts/services.sh` installs
/// it (`~/.cache/outbox-dev/bin/tansu`).
pub fn tansu_binary() -> String {
    std::env::var("TANSU_BIN").unwrap_or_else(|_| {
        format!(
            "{}/.cache/outbox-dev/bin/tansu",
            std::env::var("HOME").expect("HOME")
        )
    })
}

/// Starts a tansu broker listening on `127.0.0.1:port` that advertises
/// `advertised` (`host:port`), with memory storage (a restart loses every
/// topic and record) and its output discarded. It may not accept
/// connections yet: see [`listening`].
///
/// # Panics
/// If the binary cannot be started.
pub fn spawn_tansu(port: u16, advertised: &str) -> Child {
    let listener = format!("tcp://127.0.0.1:{port}");
    let advertised = format!("tcp://{advertised}");
    Command::new(tansu_binary())
        .args(["broker", "--listener-url", &listener])
        .args(["--advertised-listener-url", &advertised])
        .args(["--storage-engine", "memory://tansu/"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tansu binary (scripts/services.sh tansu installs it; or set TANSU_BIN)")
}

/// Whether something accepts TCP connections on `127.0.0.1:port`.
pub fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// How long a freshly spawned broker gets to accept connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Blocks until [`listening`]`(port)`, checking every 50 ms.
///
/// # Panics
/// After [`START_TIMEOUT`].
pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + START_TIMEOUT;
    while !listening(port) {
        assert!(Instant::now() < deadline, "own tansu did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`wait_listening`] for async callers: sleeps on the runtime's timer, so
/// other tasks (a proxy in front of the broker, say) keep running.
///
/// # Panics
/// After [`START_TIMEOUT`].
pub async fn wait_listening_async(port: u16) {
    let deadline = Instant::now() + START_TIMEOUT;
    while !listening(port) {
        assert!(Instant::now() < deadline, "own tansu did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
