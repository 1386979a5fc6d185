//! A TCP proxy that can **freeze** connections: stop forwarding in both
//! directions without closing anything.
//!
//! A frozen connection is what a network partition or a hung host looks
//! like to the peers: the sockets stay open, and since the kernels on both
//! sides of the proxy keep acknowledging (until the windows fill, and then
//! the zero-window probes), neither TCP keepalive nor `tcp_user_timeout`
//! ever fires. Only an application-level timeout notices. Closing a
//! connection, which the other fault scenarios do (`kill -9`), is the easy
//! case by comparison.
//!
//! Freezing can target every connection ([`Proxy::freeze_all`]), one
//! connection by the port the target sees ([`Proxy::freeze_upstream_port`]),
//! or the connections of one client process ([`Proxy::freeze_process`]), found
//! through `/proc`: the client's socket is the one whose local port is the
//! accepted connection's peer port, and it belongs to the process holding
//! its inode among its file descriptors. New connections of a frozen target
//! are frozen as they arrive (they connect, then nothing passes), like
//! connection attempts during a partition.
//!
//! ```no_run
//! # async fn run() {
//! use outbox_tests::faults::proxy::Proxy;
//! let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
//! // connect clients to proxy.address() ...
//! proxy.freeze_all();
//! proxy.thaw();
//! # }
//! ```

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// One proxied connection.
#[derive(Debug)]
struct Link {
    /// The client's port (its socket's local port).
    client_port: u16,
    /// The proxy's local port towards the target (what the target sees as
    /// the client's port, e.g. `pg_stat_activity.client_port`).
    upstream_port: u16,
    frozen: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct State {
    links: Vec<Link>,
    /// Every connection, current and new, is frozen.
    all_frozen: bool,
    /// Client processes whose connections are frozen.
    frozen_pids: HashSet<u32>,
}

/// A running proxy; stops (and drops every connection) on drop.
#[derive(Debug)]
pub struct Proxy {
    address: SocketAddr,
    state: Arc<Mutex<State>>,
    tasks: Arc<Mutex<JoinSet<()>>>,
}

impl Proxy {
    /// Starts a proxy on a free port of 127.0.0.1 forwarding to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        Self::serve(listener, target)
    }

    /// Starts a proxy on `port` of 127.0.0.1 forwarding to `target`.
    pub async fn start_on(port: u16, target: SocketAddr) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind proxy port");
        Self::serve(listener, target)
    }

    fn serve(listener: TcpListener, target: SocketAddr) -> Self {
        let address = listener.local_addr().expect("bound");
        let state = Arc::new(Mutex::new(State::default()));
        let tasks = Arc::new(Mutex::new(JoinSet::new()));
        let accept = {
            let (state, tasks) = (Arc::clone(&state), Arc::clone(&tasks));
            async move {
                loop {
                    let Ok((client, peer)) = listener.accept().await else {
                        continue;
                    };
                    let Ok(upstream) = TcpStream::connect(target).await else {
                        continue; // the target is down: the client sees a close
                    };
                    let upstream_port = upstream.local_addr().map_or(0, |a| a.port());
                    let frozen = {
                        let mut state = state.lock().expect("proxy state");
                        let frozen = state.all_frozen
                            || (!state.frozen_pids.is_empty()
                                && owner_of(address.port(), peer.port())
                                    .is_some_and(|pid| state.frozen_pids.contains(&pid)));
                        let (sender, _) = watch::channel(frozen);
                        state.links.push(Link {
                            client_port: peer.port(),
                            upstream_port,
                            frozen: sender,
                        });
                        state.links.last().expect("pushed").frozen.subscribe()
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (upstream_read, upstream_write) = upstream.into_split();
                    let mut tasks = tasks.lock().expect("proxy tasks");
                    tasks.spawn(pump(client_read, upstream_write, frozen.clone()));
                    tasks.spawn(pump(upstream_read, client_write, frozen));
                }
            }
        };
        tasks.lock().expect("proxy tasks").spawn(accept);
        Self {
            address,
            state,
            tasks,
        }
    }

    /// The address clients connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// Freezes every connection, and every new one until [`thaw`](Self::thaw).
    pub fn freeze_all(&self) {
        let mut state = self.state.lock().expect("proxy state");
        state.all_frozen = true;
        for link in &state.links {
            link.frozen.send_replace(true);
        }
    }

    /// Freezes the connections of the client process `pid`, and its new ones
    /// until [`thaw`](Self::thaw). Returns how many open connections it froze.
    pub fn freeze_process(&self, pid: u32) -> usize {
        let inodes = socket_inodes_of(pid);
        let sockets = client_sockets(self.address.port());
        let mut state = self.state.lock().expect("proxy state");
        state.frozen_pids.insert(pid);
        let mut frozen = 0;
        for link in &state.links {
            let owned = sockets
                .get(&link.client_port)
                .is_some_and(|inode| inodes.contains(inode));
            if owned && !link.frozen.is_closed() {
                link.frozen.send_replace(true);
                frozen += 1;
            }
        }
        frozen
    }

    /// Freezes the one open connection whose upstream port (what the target
    /// sees as the client's port, e.g. PostgreSQL's `inet_client_port()`)
    /// is `port`; false if there is none.
    pub fn freeze_upstream_port(&self, port: u16) -> bool {
        let state = self.state.lock().expect("proxy state");
        let link = state
            .links
            .iter()
            .find(|link| link.upstream_port == port && !link.frozen.is_closed());
        if let Some(link) = link {
            link.frozen.send_replace(true);
        }
        link.is_some()
    }

    /// Forwards again on every connection (what was held back flows).
    pub fn thaw(&self) {
        let mut state = self.state.lock().expect("proxy state");
        state.all_frozen = false;
        state.frozen_pids.clear();
        for link in &state.links {
            link.frozen.send_replace(false);
        }
    }

    /// The proxy's local ports towards the target of its open connections
    /// (frozen ones only, if `frozen_only`): what the target sees as client
    /// ports.
    pub fn upstream_ports(&self, frozen_only: bool) -> Vec<u16> {
        let state = self.state.lock().expect("proxy state");
        state
            .links
            .iter()
            .filter(|link| !link.frozen.is_closed())
            .filter(|link| !frozen_only || *link.frozen.borrow())
            .map(|link| link.upstream_port)
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.abort_all();
        }
    }
}

/// Copies `from` to `to` while not frozen. A frozen pump reads nothing, so
/// the data (and an end of stream) waits in the kernel's buffers.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|frozen| !*frozen).await.is_err() {
            return;
        }
        tokio::select! {
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => {
                    if to.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                }
            },
            () = async {
                let _ = frozen.wait_for(|frozen| *frozen).await;
            } => {}
        }
    }
}

/// The process owning the client end of a connection accepted on
/// `listen_port` from `client_port` (both on 127.0.0.1).
fn owner_of(listen_port: u16, client_port: u16) -> Option<u32> {
    let inode = *client_sockets(listen_port).get(&client_port)?;
    let pids = std::fs::read_dir("/proc").ok()?;
    pids.filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| socket_inodes_of(pid).contains(&inode))
}

/// Client sockets connected to 127.0.0.1:`listen_port`: local port -> inode
/// (from `/proc/net/tcp`).
fn client_sockets(listen_port: u16) -> HashMap<u16, u64> {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return HashMap::new();
    };
    let remote = format!("0100007F:{listen_port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 10 || fields[2] != remote {
                return None;
            }
            let port = u16::from_str_radix(fields[1].rsplit(':').next()?, 16).ok()?;
            Some((port, fields[9].parse().ok()?))
        })
        .collect()
}

/// Inodes of the sockets among the open file descriptors of `pid`.
fn socket_inodes_of(pid: u32) -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    async fn round_trip(socket: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
        socket.write_all(b"ping").await.ok()?;
        let mut buffer = [0u8; 4];
        tokio::time::timeout(wait, socket.read_exact(&mut buffer))
            .await
            .ok()?
            .ok()?;
        Some(buffer.to_vec())
    }

    #[tokio::test]
    async fn a_frozen_connection_stays_open_and_resumes_when_thawed() {
        let proxy = Proxy::start(echo_server().await).await;
        let mut socket = TcpStream::connect(proxy.address()).await.unwrap();
        let wait = Duration::from_millis(300);
        assert_eq!(
            round_trip(&mut socket, wait).await.as_deref(),
            Some(&b"ping"[..])
        );

        proxy.freeze_all();
        assert_eq!(
            round_trip(&mut socket, wait).await,
            None,
            "frozen: no answer"
        );
        let mut fresh = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut fresh, wait).await, None, "new ones too");
        assert_eq!(proxy.upstream_ports(true).len(), 2);

        proxy.thaw();
        // What was sent while frozen comes through, in order.
        let mut buffer = [0u8; 4];
        socket.read_exact(&mut buffer).await.unwrap();
        assert_eq!(&buffer, b"ping");
        assert_eq!(
            round_trip(&mut socket, wait).await.as_deref(),
            Some(&b"ping"[..])
        );
        assert!(proxy.upstream_ports(true).is_empty());
    }

    #[tokio::test]
    async fn freezing_a_process_freezes_its_connections_only() {
        let proxy = Proxy::start(echo_server().await).await;
        let mut ours = TcpStream::connect(proxy.address()).await.unwrap();
        let wait = Duration::from_millis(300);
        assert!(round_trip(&mut ours, wait).await.is_some());
        // Another process: nothing of ours is frozen.
        assert_eq!(proxy.freeze_process(1), 0);
        assert!(round_trip(&mut ours, wait).await.is_some());
        proxy.thaw();
        // This process: its connection freezes, and a new one arrives frozen.
        assert_eq!(proxy.freeze_process(std::process::id()), 1);
        assert_eq!(round_trip(&mut ours, wait).await, None);
        let mut fresh = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut fresh, wait).await, None);
        proxy.thaw();
        let mut buffer = [0u8; 4];
        fresh.read_exact(&mut buffer).await.unwrap();
        assert_eq!(&buffer, b"ping");
    }
}
