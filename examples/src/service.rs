//! What the example services share: errors, tuning, Kafka settings, topics,
//! the running service (relay, consumer, probes), the HTTP server and the
//! shutdown signal.

use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use sqlx::{Pool, Postgres};
use txoutbox_runtime::consumer::{Consumer, ConsumerBuilder};
use txoutbox_runtime::lifecycle::Stopped;
use txoutbox_runtime::relay::Relay;
use txoutbox_runtime::service::Service;

use rdkafka::ClientConfig;

use crate::database::ExampleDatabase;
use crate::setup::Broker;

/// Why a service could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Set-up (database, broker) failed.
    #[error(transparent)]
    Setup(#[from] crate::setup::SetupError),
    /// The framework's migrations failed.
    #[error(transparent)]
    Migrate(#[from] txoutbox_runtime::migrations::MigrateError),
    /// A domain migration failed.
    #[error("database error: {}", txoutbox_core::DbErrorDisplay(.0))]
    Database(#[source] sqlx::Error),
    /// The relay refused its configuration.
    #[error(transparent)]
    RelayBuild(#[from] txoutbox_runtime::relay::BuildError),
    /// The consumer could not be built.
    #[error(transparent)]
    ConsumerBuild(#[from] txoutbox_runtime::consumer::BuildError),
    /// Kafka administration (topic creation) failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Creating a topic failed.
    #[error("could not create topic `{topic}`: {reason}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The broker's reason.
        reason: String,
    },
    /// The HTTP listener failed.
    #[error("http listener: {0}")]
    Listen(#[source] std::io::Error),
    /// A service task panicked or was cancelled.
    #[error("service task failed: {0}")]
    Task(String),
    /// The demo was asked for something this database does not run.
    #[error("{0}")]
    Unsupported(String),
    /// The relay or the consumer did not stop cleanly.
    #[error(transparent)]
    Shutdown(Box<txoutbox_runtime::service::ServiceError>),
    /// The relay or a consumer stopped although nobody asked it to: the
    /// service no longer does its job and exits so that it is restarted.
    #[error("a task stopped on its own: {reason}")]
    Stopped {
        /// Which task and why, as [`Service::stopped`] reports it
        /// (`relay: the relay panicked: ...`).
        reason: String,
    },
}

impl From<crate::database::SchemaError> for ServiceError {
    fn from(error: crate::database::SchemaError) -> Self {
        match error {
            crate::database::SchemaError::Framework(error) => Self::Migrate(error),
            crate::database::SchemaError::Service(error) => Self::Database(error),
        }
    }
}

/// What makes one example service on database `DB`: its name, its HTTP
/// routes and its consumer's handlers and settings. Everything else (the
/// relay of its outbox, the probes, start-up and shutdown) is
/// [`RunningService`]'s. Each service implements it for every
/// [`ExampleDatabase`] its SQL is written for.
pub trait ServiceKind<DB: ExampleDatabase = Postgres>: Send + Sync + 'static {
    /// The service's name, for `Debug`.
    const NAME: &'static str;

    /// Its own HTTP routes (besides `/metrics` and `/health/*`).
    fn routes(_pool: &Pool<DB>) -> Router {
        Router::new()
    }

    /// Its consumer: `builder` with the service's handlers and settings.
    fn consumer(builder: ConsumerBuilder<DB>, tuning: &Tuning) -> ConsumerBuilder<DB>;
}

/// A running example service: its HTTP listener (its own routes plus
/// `/metrics` and `/health/*` over the relay and the consumer), and the
/// relay of its outbox with its consumer, as one [`Service`], on database
/// `DB` (PostgreSQL unless started on a `MySqlPool`).
pub struct RunningService<S, DB = Postgres> {
    /// Where the HTTP server (with `/metrics` and `/health/*`) listens.
    pub addr: SocketAddr,
    server: HttpServer,
    service: Service,
    kind: PhantomData<fn() -> (S, DB)>,
}

impl<S: ServiceKind<DB>, DB: ExampleDatabase> std::fmt::Debug for RunningService<S, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(S::NAME)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl<S: ServiceKind<DB>, DB: ExampleDatabase> RunningService<S, DB> {
    /// Starts the service on `listener`: the relay of its outbox in `pool`
    /// (which also moves scheduled events into the outbox when due), its
    /// consumer (group `group_id`) against the Kafka cluster at
    /// `bootstrap_servers`, and its routes with the probes
    /// ([`crate::observability`]). The pool's database (`PgPool` or
    /// `MySqlPool`) is the service's.
    pub async fn start(
        pool: Pool<DB>,
        bootstrap_servers: &str,
        group_id: &str,
        listener: TcpListener,
        tuning: &Tuning,
    ) -> Result<Self, ServiceError> {
        use crate::observability::{self, Liveness};
        let relay = Relay::builder(
            DB::relay_database(pool.clone()),
            kafka_config(bootstrap_servers),
        )
        .poll_interval(tuning.poll_interval)
        .schedule_poll_interval(tuning.poll_interval)
        .spawn()?;
        let consumer =
            Consumer::builder(pool.clone(), consumer_config(bootstrap_servers), group_id);
        let consumer = S::consumer(consumer, tuning).build()?.spawn();
        let service = Service::new().relay(relay).consumer(consumer);
        let probes = observability::router(
            pool.clone(),
            Liveness::of(service.status()),
            tuning.readiness.clone(),
            observability::prometheus(),
        );
        let server = HttpServer::start(listener, S::routes(&pool).merge(probes))?;
        Ok(Self {
            addr: server.addr,
            server,
            service,
            kind: PhantomData,
        })
    }

    /// Resolves when the relay or the consumer stopped on its own (never
    /// after a requested stop), with which one and why. Services select on
    /// it next to their shutdown signal and exit non-zero when it fires.
    pub fn failure(&self) -> impl Future<Output = ServiceError> + Send + 'static {
        let stopped = self.service.stopped();
        async move {
            match stopped.await {
                Stopped::Failed(reason) => ServiceError::Stopped { reason },
                _ => std::future::pending().await,
            }
        }
    }

    /// Stops accepting requests, then stops the consumer and the relay, each
    /// finishing what it has in flight.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        let served = self.server.shutdown().await;
        let tasks = self.service.shutdown().await;
        served?;
        tasks.map_err(|error| ServiceError::Shutdown(Box::new(error)))
    }
}

/// Knobs the demo and the tests turn.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Relay and inbox processor idle poll interval.
    pub poll_interval: Duration,
    /// When `/health/ready` fails.
    pub readiness: crate::observability::Readiness,
    /// What the payments service's handler is written with (default: sqlx).
    pub payments_orm: crate::payments_sea_orm::PaymentsOrm,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(100),
            readiness: crate::observability::Readiness::default(),
            payments_orm: crate::payments_sea_orm::PaymentsOrm::default(),
        }
    }
}

/// A service's HTTP server: serves its router on a listener until shut down.
pub struct HttpServer {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl HttpServer {
    /// Serves `router` on `listener`.
    pub fn start(listener: TcpListener, router: Router) -> Result<Self, ServiceError> {
        let addr = listener.local_addr().map_err(ServiceError::Listen)?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await
        });
        Ok(Self { addr, task, stop })
    }

    /// Stops accepting connections and waits for the requests in progress.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        self.stop.cancel();
        self.task
            .await
            .map_err(|e| ServiceError::Task(e.to_string()))?
            .map_err(ServiceError::Listen)
    }
}

/// Kafka client settings for `bootstrap_servers`, plus every librdkafka
/// setting given as a `KAFKA_*` environment variable (kcat's convention, as
/// the `outbox` tool: `KAFKA_SECURITY_PROTOCOL=SASL_SSL`,
/// `KAFKA_SASL_USERNAME`, `KAFKA_SASL_PASSWORD`, `KAFKA_SSL_CA_LOCATION`...;
/// see `txoutbox_runtime::kafka_settings`), so the services reach a TLS or SASL
/// cluster without code changes.
pub fn kafka_config(bootstrap_servers: &str) -> ClientConfig {
    let mut settings = txoutbox_runtime::kafka_settings::KafkaSettings::new();
    settings
        .env(std::env::vars())
        .set("bootstrap.servers", bootstrap_servers);
    settings.client_config()
}

/// Consumer settings: [`kafka_config`] plus a short session, so a restarted
/// service gets its partitions back within seconds instead of the default 45 s.
pub fn consumer_config(bootstrap_servers: &str) -> ClientConfig {
    let mut config = kafka_config(bootstrap_servers);
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    config
}

/// Creates the topics the example services need on `broker` if they do not
/// exist yet: the events' topics with `partitions` partitions and the
/// dead-letter topics of the consumed ones (what `outbox topics apply` does
/// from the `schemas` binary's registries; [`txoutbox_runtime::topics`]).
pub async fn create_topics(broker: &Broker, partitions: i32) -> Result<(), ServiceError> {
    let wanted = txoutbox_runtime::topics::required(
        &txoutbox_runtime::topics::TopicDefaults::default().partitions(partitions),
    );
    let servers = match broker {
        Broker::Mock(cluster) => {
            // The mock cluster has no CreateTopics API; it is configured directly.
            for spec in &wanted {
                cluster.create_topic(&spec.name, spec.partitions, spec.replication)?;
            }
            return Ok(());
        }
        Broker::External(servers) => servers,
    };
    let kafka = kafka_config(servers);
    let plan = txoutbox_runtime::topics::plan(&kafka, &wanted)
        .await
        .map_err(topic_error)?;
    txoutbox_runtime::topics::apply(&kafka, &plan)
        .await
        .map_err(topic_error)?;
    Ok(())
}

fn topic_error(error: txoutbox_runtime::topics::TopicsError) -> ServiceError {
    match error {
        txoutbox_runtime::topics::TopicsError::Create { topic, reason } => {
            ServiceError::CreateTopic { topic, reason }
        }
        other => ServiceError::CreateTopic {
            topic: "(all)".into(),
            reason: other.to_string(),
        },
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// Waits for Ctrl-C / SIGTERM (`Ok`), or for `failure`: the relay or the
/// consumer stopped on its own (`Err`, logged). Either way the caller then
/// shuts the service down; on `Err` it exits non-zero, so that an
/// orchestrator restarts it.
pub async fn until_signal_or_failure(
    failure: impl Future<Output = ServiceError>,
) -> Result<(), ServiceError> {
    tokio::select! {
        () = shutdown_signal() => {
            tracing::info!("stopping: finishing in-flight work");
            Ok(())
        }
        error = failure => {
            tracing::error!(%error, "stopping the service");
            Err(error)
        }
    }
}

/// The exit of a service binary: success, or the error on one line and code 2.
pub fn exit_code(result: Result<(), Box<dyn std::error::Error>>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::from(2)
        }
    }
}
