//! The scenario's own brokers: a tansu broker on a free port, that can be
//! stopped and restarted (memory storage: a restart loses every topic and
//! record), optionally behind a freezing [`Proxy`]; or librdkafka's mock
//! cluster of several brokers, one of which can be taken down and brought
//! back (its partitions keep their records).

use std::process::Child;
use std::sync::mpsc;
use std::thread::JoinHandle;

use rdkafka::mocking::{MockCluster, MockCoordinator};
use txoutbox_testkit::broker::{create_topics, free_port, spawn_tansu, wait_listening_async};

use super::model::{DLQ_TOPIC, TOPIC};
use super::proxy::Proxy;

/// The brokers a scenario runs against.
#[derive(Debug)]
pub enum Cluster {
    /// One tansu process.
    Tansu(Broker),
    /// librdkafka's mock cluster, in the test process.
    Mock(MockBrokers),
}

impl Cluster {
    /// `bootstrap.servers` of the cluster.
    pub fn address(&self) -> String {
        match self {
            Self::Tansu(broker) => broker.address(),
            Self::Mock(mock) => mock.address().to_owned(),
        }
    }

    /// The freezing proxy in front of a tansu broker, if it has one.
    pub fn proxy(&self) -> Option<&Proxy> {
        match self {
            Self::Tansu(broker) => broker.proxy(),
            Self::Mock(_) => None,
        }
    }
}

/// The broker process; killed on drop.
#[derive(Debug)]
pub struct Broker {
    port: u16,
    partitions: i32,
    child: Option<Child>,
    proxy: Option<Proxy>,
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
        self.child = Some(spawn_tansu(self.port, &self.address()));
        wait_listening_async(self.port).await;
        create_topics(&self.address(), &[(TOPIC, self.partitions), (DLQ_TOPIC, 1)]).await;
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

enum MockCommand {
    Down(i32, mpsc::Sender<()>),
    Up(i32, mpsc::Sender<()>),
}

/// librdkafka's mock cluster with several brokers. It listens on real local
/// ports, so the harness processes connect to its bootstrap address like to
/// any broker; it lives on a thread of its own (its handle is not `Send`),
/// which this value commands. Partition `p` of a topic is led by broker
/// `p % brokers + 1`; the consumer groups' coordinator is broker 1.
#[derive(Debug)]
pub struct MockBrokers {
    address: String,
    brokers: i32,
    commands: Option<mpsc::Sender<MockCommand>>,
    thread: Option<JoinHandle<()>>,
}

impl MockBrokers {
    /// Starts `brokers` brokers and creates the workload's topics: `partitions`
    /// partitions, and one for the dead-letter topic.
    ///
    /// # Panics
    /// If librdkafka cannot create the cluster.
    pub fn start(brokers: i32, partitions: i32, groups: &[&str]) -> Self {
        let (commands, received) = mpsc::channel();
        let (ready, started) = mpsc::channel();
        let groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        let thread = std::thread::spawn(move || {
            let cluster = MockCluster::new(brokers).expect("mock cluster");
            for (topic, count) in [(TOPIC, partitions), (DLQ_TOPIC, 1)] {
                cluster.create_topic(topic, count, 1).expect("mock topic");
                for partition in 0..count {
                    cluster
                        .partition_leader(topic, partition, Some(partition % brokers + 1))
                        .expect("partition leader");
                }
            }
            for group in groups {
                cluster
                    .coordinator(MockCoordinator::Group(group), 1)
                    .expect("group coordinator");
            }
            ready
                .send(cluster.bootstrap_servers())
                .expect("test waits for the cluster");
            for command in received {
                let (result, done) = match command {
                    MockCommand::Down(id, done) => (cluster.broker_down(id), done),
                    MockCommand::Up(id, done) => (cluster.broker_up(id), done),
                };
                result.expect("mock broker command");
                let _ = done.send(());
            }
        });
        let address = started.recv().expect("mock cluster started");
        Self {
            address,
            brokers,
            commands: Some(commands),
            thread: Some(thread),
        }
    }

    /// `bootstrap.servers`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Number of brokers (ids 1 to this).
    pub fn brokers(&self) -> i32 {
        self.brokers
    }

    /// The partitions of `partitions` that `broker` leads.
    pub fn led_by(&self, broker: i32, partitions: i32) -> Vec<i32> {
        (0..partitions)
            .filter(|p| p % self.brokers + 1 == broker)
            .collect()
    }

    /// Disconnects `broker` and refuses new connections (its partitions keep
    /// their leader: they are unavailable until [`up`](Self::up)).
    pub fn down(&self, broker: i32) {
        self.command(|done| MockCommand::Down(broker, done));
    }

    /// Lets `broker` accept connections again.
    pub fn up(&self, broker: i32) {
        self.command(|done| MockCommand::Up(broker, done));
    }

    fn command(&self, command: impl FnOnce(mpsc::Sender<()>) -> MockCommand) {
        let (done, finished) = mpsc::channel();
        self.commands
            .as_ref()
            .expect("running")
            .send(command(done))
            .expect("mock cluster thread");
        finished.recv().expect("mock cluster thread");
    }
}

impl Drop for MockBrokers {
    fn drop(&mut self) {
        self.commands = None; // ends the thread's loop; it drops the cluster
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A Kafka client of a frozen process stays frozen, also through the
    /// connections it opens afterwards (a new producer after a rebuild).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_kafka_client_cannot_reach_the_broker_through_new_connections() {
        use rdkafka::ClientConfig;
        use rdkafka::producer::{BaseProducer, Producer};

        let broker = Broker::start_behind_proxy(1).await;
        let proxy = broker.proxy().expect("behind a proxy");
        let address = broker.address();
        let metadata = move |timeout: Duration| {
            let address = address.clone();
            tokio::task::spawn_blocking(move || {
                let producer: BaseProducer = ClientConfig::new()
                    .set("bootstrap.servers", &address)
                    .create()
                    .unwrap();
                producer.client().fetch_metadata(None, timeout).is_ok()
            })
        };
        assert!(metadata(Duration::from_secs(10)).await.unwrap());
        proxy.freeze_process(std::process::id());
        assert!(
            !metadata(Duration::from_secs(2)).await.unwrap(),
            "a new client of the frozen process got through"
        );
        proxy.thaw();
        assert!(metadata(Duration::from_secs(10)).await.unwrap());
    }
}
