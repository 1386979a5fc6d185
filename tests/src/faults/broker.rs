//! A tansu broker of the scenario's own, on a free port, that can be stopped
//! and restarted (memory storage: a restart loses every topic and record),
//! optionally behind a freezing [`Proxy`].

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;

use super::model::{DLQ_TOPIC, TOPIC};
use super::proxy::Proxy;

/// The broker process; killed on drop.
#[derive(Debug)]
pub struct Broker {
    port: u16,
    partitions: i32,
    child: Option<Child>,
    proxy: Option<Proxy>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("bound")
        .port()
}

impl Broker {
    /// Starts a broker on a free port and creates the workload's topics with
    /// `partitions` partitions (the dead-letter topic gets one).
    pub async fn start(partitions: i32) -> Self {
        let mut broker = Self {
            port: free_port(),
            partitions,
            child: None,
            proxy: None,
        };
        broker.restart().await;
        broker
    }

    /// Like [`start`](Self::start), behind a [`Proxy`] whose address the
    /// broker advertises, so that every client (after bootstrap too) goes
    /// through it and the proxy can freeze one process's connections.
    pub async fn start_behind_proxy(partitions: i32) -> Self {
        let port = free_port();
        let proxy = Proxy::start(([127, 0, 0, 1], port).into()).await;
        let mut broker = Self {
            port,
            partitions,
            child: None,
            proxy: Some(proxy),
        };
        broker.restart().await;
        broker
    }

    /// The proxy in front of the broker, if it has one.
    pub fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }

    /// `host:port` for `bootstrap.servers` (the proxy's, if there is one).
    pub fn address(&self) -> String {
        let port = self.proxy.as_ref().map_or(self.port, Proxy::port);
        format!("127.0.0.1:{port}")
    }

    /// Kills the broker (SIGKILL).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// (Re)starts the broker on the same port and creates the topics.
    pub async fn restart(&mut self) {
        self.stop();
        let bin = std::env::var("TANSU_BIN").unwrap_or_else(|_| {
            format!(
                "{}/.cache/outbox-dev/bin/tansu",
                std::env::var("HOME").expect("HOME")
            )
        });
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://{}", self.address());
        let child = Command::new(bin)
            .args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu binary (scripts/services.sh tansu installs it; or set TANSU_BIN)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "own tansu did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.create_topics().await;
    }

    async fn create_topics(&self) {
        let admin: AdminClient<_> = ClientConfig::new()
            .set("bootstrap.servers", self.address())
            .create()
            .expect("admin client");
        let topics = [
            NewTopic::new(TOPIC, self.partitions, TopicReplication::Fixed(1)),
            NewTopic::new(DLQ_TOPIC, 1, TopicReplication::Fixed(1)),
        ];
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics(&topics, &options)
            .await
            .expect("create topics");
        for result in results {
            if let Err((name, code)) = result {
                assert_eq!(code, RDKafkaErrorCode::TopicAlreadyExists, "{name}");
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}
