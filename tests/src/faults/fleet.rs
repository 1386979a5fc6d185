//! The scenario's processes: writers, relays and consumers, each a separate
//! OS process (so `kill -9` is real), restartable with the same settings.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::env;

/// What a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A `faults-writer`.
    Writer,
    /// A `faults-relay`.
    Relay,
    /// A `faults-consumer`.
    Consumer,
    /// A `faults-saga` saga host: the saga service's relay and its consumer
    /// running the saga (see [`super::saga`]).
    SagaHost,
    /// A `faults-saga` participant: the participant service's relay and its
    /// consumer applying reservations, charges and releases.
    Participant,
}

/// One harness process and how to start it again.
#[derive(Debug)]
pub struct Member {
    /// Its role.
    pub role: Role,
    /// A name for logs (`relay-2`).
    pub name: String,
    binary: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
    starts: u32,
    log_dir: PathBuf,
    /// Stopped for good (a rolling deploy replaced it): never revived.
    retired: bool,
}

impl Member {
    fn spawn(&mut self) {
        let log = self
            .log_dir
            .join(format!("{}.{}.log", self.name, self.starts));
        let stderr = File::create(&log).expect("log file");
        let stdout = stderr.try_clone().expect("log file");
        let mut command = Command::new(&self.binary);
        command
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        self.child = Some(command.spawn().expect("spawn harness process"));
        self.starts += 1;
    }

    /// The consumer group it was started with (consumers).
    pub fn group(&self) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(name, _)| name == env::GROUP)
            .map(|(_, value)| value.as_str())
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL on Unix
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Waits for the process to exit by itself (writers), at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match self.child.as_mut().map(Child::try_wait) {
                None | Some(Ok(Some(_))) | Some(Err(_)) => {
                    self.child = None;
                    return true;
                }
                Some(Ok(None)) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    }

    /// Stops it for good (a rolling deploy retiring an old version): never
    /// revived afterwards. With `grace`, SIGTERM then SIGKILL after it;
    /// without, SIGKILL at once.
    pub fn retire(&mut self, grace: Option<Duration>) {
        self.retired = true;
        match grace {
            Some(grace) => self.terminate(grace),
            None => self.kill9(),
        }
    }

    /// Whether it was started with `name=value`.
    pub fn has_env(&self, name: &str, value: &str) -> bool {
        self.env.iter().any(|(k, v)| k == name && v == value)
    }

    /// Whether its log of the current run contains `needle`.
    pub fn log_contains(&self, needle: &str) -> bool {
        let log = self.log_dir.join(format!(
            "{}.{}.log",
            self.name,
            self.starts.saturating_sub(1)
        ));
        std::fs::read_to_string(log).is_ok_and(|text| text.contains(needle))
    }

    /// How many times it was started (1: it never died).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Starts it again (after a kill) with the same settings.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Replaces (or adds) one environment variable for the next start.
    pub fn set_env(&mut self, name: &str, value: impl Into<String>) {
        self.env.retain(|(k, _)| k != name);
        self.env.push((name.to_owned(), value.into()));
    }
}

/// All processes of a scenario.
#[derive(Debug)]
pub struct Fleet {
    /// Every member, in start order.
    pub members: Vec<Member>,
    log_dir: PathBuf,
    /// Settings every process gets.
    common: Vec<(String, String)>,
}

impl Fleet {
    /// An empty fleet whose processes share `common` settings and log into
    /// `log_dir`.
    pub fn new(log_dir: PathBuf, common: Vec<(String, String)>) -> Self {
        std::fs::create_dir_all(&log_dir).expect("log dir");
        Self {
            members: Vec::new(),
            log_dir,
            common,
        }
    }

    /// Starts a process of `role` from `binary` with extra settings.
    pub fn start(&mut self, role: Role, binary: &str, extra: &[(&str, String)]) -> usize {
        let index = self.members.iter().filter(|m| m.role == role).count();
        let mut env = self.common.clone();
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        if role == Role::Writer {
            env.push((env::WRITER.to_owned(), index.to_string()));
        }
        let mut member = Member {
            role,
            name: format!("{role:?}-{index}").to_lowercase(),
            binary: PathBuf::from(binary),
            env,
            child: None,
            starts: 0,
            log_dir: self.log_dir.clone(),
            retired: false,
        };
        member.spawn();
        self.members.push(member);
        self.members.len() - 1
    }

    /// Indices of the members of `role`.
    pub fn of(&self, role: Role) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].role == role)
            .collect()
    }

    /// Restarts every relay and consumer that died (writers that exited are done).
    pub fn revive(&mut self) -> usize {
        let mut revived = 0;
        for member in &mut self.members {
            if member.role != Role::Writer && !member.retired && !member.alive() {
                member.restart();
                revived += 1;
            }
        }
        revived
    }

    /// Stops every process: SIGTERM, then SIGKILL after `grace`.
    pub fn stop_all(&mut self, grace: Duration) {
        // Signal all first so they shut down in parallel.
        for member in &self.members {
            if let Some(child) = &member.child {
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
            }
        }
        for member in &mut self.members {
            member.terminate(grace);
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill9();
        }
    }
}
